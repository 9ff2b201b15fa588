"""The shop: a very small customer-service world, sized so a from-scratch model can learn it on a laptop CPU.

The CPU demo (`python -m demo`) needs a world where a model of about a million parameters, trained
for a few minutes, can hold the whole conversation in mind and copy what it must copy. tau2's retail tools
answer with whole JSON records (hundreds of tokens) and its tasks need a dozen steps; the synthetic retail world
(synthetic.py) is smaller but still ~1,000 tokens per conversation. The shop keeps the shape of a MUA-RL task,
the part RL is about, and drops the bulk:

    customer: Hi, I want to cancel my order #W372.
    agent   : -> get_order_details({"order_id": "#W372"})
    tool    : {"order_id": "#W372", "item": "lamp", "status": "pending"}
    agent   : Why do you cancel: 'no longer needed' or 'ordered by mistake'?
    customer: It was ordered by mistake.
    agent   : -> cancel_pending_order({"order_id": "#W372", "reason": "ordered by mistake"})
    tool    : {"order_id": "#W372", "item": "lamp", "status": "cancelled", ...}
    agent   : Done: order #W372 is cancelled.
    customer: ###STOP###

Kinds: "cancel" (a pending order; the customer gives a reason), "return" (a delivered order; the customer says
where the refund goes), "refuse" (cancel a delivered order or return a pending one: the policy forbids it, the
tools do NOT, so only an agent that reads the status and declines keeps the database unchanged).

The reward is the database, as everywhere in this project: a cancellation with the wrong reason, a refund to
the wrong place, or a forbidden write scores 0.

The lazy annotator (why RL has something to learn here)
-------------------------------------------------------
MUA-RL's claim is that RL improves on its cold-start data: the SFT trajectories teach the format and the flow,
RL against the real reward teaches what the data got wrong. The shop makes that visible on purpose. Its
cold-start conversations (Task.expert of the training tasks) come from a lazy annotator: it asks for the
customer's reason / refund choice, and when the customer wants the non-default one ('ordered by mistake',
'gift card') it still writes the default ('no longer needed', 'original payment') with probability
`lazy_rate` (0.6). SFT learns exactly that: after "To a gift card, please." the model writes 'gift card' only
~40 % of the time, so greedy decoding gets every such task wrong. The right behaviour is in the data, outvoted;
sampling finds it often enough for GRPO's groups to disagree, and only the database reward says which is right.
Gold actions (what the reward checks) always follow the customer; held-out tasks are written without laziness.
(Measured while designing this: an annotator that *guesses* at random leaves SFT with no trace of the right
dependency, and 40 GRPO steps did not build one; one that is right 3 times in 4 leaves greedy SFT at 97 %.)

    build_world(seed, n_orders, n_test_orders, n_train, n_test, lazy_rate)    -> World (tasks split train/test)
    scripted_first_message(spec) / scripted_reply(spec, history)               the customer (user_sim.ScriptedUser)

Held-out tasks use orders no training task mentions, so their ids must be copied from the conversation, not
remembered.
"""

from __future__ import annotations

import argparse
import json
import random
import re

from domains.base import Store, Task, World, content_key

SHOP_VERSION = "1"
STOP = "###STOP###"
# What the customer answers: each answer contains the argument's words, so following the customer is a copy
REASONS = {"no longer needed": "It is no longer needed.", "ordered by mistake": "It was ordered by mistake."}
REFUNDS = {"original payment": "To the original payment, please.", "gift card": "To a gift card, please."}
DEFAULT = {"reason": "no longer needed", "refund_to": "original payment"}  # what the lazy annotator writes
ITEMS = ["lamp", "mug", "desk", "chair", "kettle", "scarf", "watch", "towel", "pillow", "clock", "vase", "fan"]

POLICY = """You are a shop agent. First look up the order. Only pending orders can be cancelled and only \
delivered orders can be returned: politely refuse anything else. Ask why a customer cancels ('no longer needed' \
or 'ordered by mistake'), or where a refund goes ('original payment' or 'gift card'), and do what they say. \
One tool call per message."""

ASK_REASON = "Why do you cancel: 'no longer needed' or 'ordered by mistake'?"
ASK_REFUND = "Where should the refund go: 'original payment' or 'gift card'?"
DONE = {"cancel": "Done: order {} is cancelled.", "return": "Done: order {} is returned."}
REFUSE = {"cancel": "Sorry, order {} is {}, so it cannot be cancelled.",
          "return": "Sorry, order {} is {}, so it cannot be returned."}

# ---------------------------------------------------------------------------------------------------------------
# Tools: plain functions of the database (see domains/base.py). Status rules are the policy's, not the tools'.


def _order(db: Store, order_id: str) -> dict:
    order = db.get("orders", order_id)
    if order is None:
        raise ValueError(f"order {order_id} not found")
    return order


def _update(db: Store, order_id: str, **fields) -> dict:
    """The one write both write tools make: set `fields` on the order, store it, return it."""
    o = _order(db, order_id)
    o.update(fields)
    db.put("orders", order_id, o)
    return o


def get_order_details(db: Store, order_id: str) -> dict:
    """Get an order's item and status.

    Args:
        order_id: The order id, such as '#W123'.
    """
    o = _order(db, order_id)
    return {"order_id": o["order_id"], "item": o["item"], "status": o["status"]}


def cancel_pending_order(db: Store, order_id: str, reason: str) -> dict:
    """Cancel an order.

    Args:
        order_id: The order id.
        reason: 'no longer needed' or 'ordered by mistake'.
    """
    if reason not in REASONS:
        raise ValueError("reason must be 'no longer needed' or 'ordered by mistake'")
    return _update(db, order_id, status="cancelled", reason=reason)


def return_delivered_order(db: Store, order_id: str, refund_to: str) -> dict:
    """Return an order.

    Args:
        order_id: The order id.
        refund_to: 'original payment' or 'gift card'.
    """
    if refund_to not in REFUNDS:
        raise ValueError("refund_to must be 'original payment' or 'gift card'")
    return _update(db, order_id, status="returned", refund_to=refund_to)


TOOLS = [get_order_details, cancel_pending_order, return_delivered_order]
WRITE_TOOLS = {"cancel_pending_order", "return_delivered_order"}

# ---------------------------------------------------------------------------------------------------------------
# The customer: first message, then keyword-driven replies to the agent's text (tool traffic is invisible)


def scripted_first_message(spec: dict) -> str:
    return f"Hi, I want to {spec['request']} my order {spec['order_id']}."


def scripted_reply(spec: dict, history: list[dict]) -> str:
    """Reveal the reason / refund choice when asked; stop once the agent reports done or declines."""
    mine = [m["content"] for m in history if m["role"] == "user"]
    agent = [(m.get("content") or "") for m in history if m["role"] == "assistant"]
    if not agent or len(mine) >= spec["max_user_turns"] - 1:
        return STOP
    t = agent[-1].lower()
    if re.search(r"\b(done|sorry|cannot)\b", t):
        return STOP
    if "cancel" in t and "mistake" in t and spec["reason"]:
        return REASONS[spec["reason"]]
    if "refund" in t and spec["refund_to"]:
        return REFUNDS[spec["refund_to"]]
    if len(mine) >= 2 and mine[-1] == mine[-2]:
        return STOP  # going in circles
    return scripted_first_message(spec)


# ---------------------------------------------------------------------------------------------------------------
# Tasks and their (careless) expert conversations


def _call(name: str, args: dict) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": args}}]}


def make_task(world: World, order: dict, request: str, rng: random.Random, lazy_rate: float, task_id: str) -> Task:
    """One task on `order`; its expert conversation is played against the real tools and the scripted customer."""
    oid, status = order["order_id"], order["status"]
    allowed = (request, status) in (("cancel", "pending"), ("return", "delivered"))
    spec = {"world": "shop", "kind": request if allowed else "refuse", "request": request, "order_id": oid,
            "status": status, "reason": None, "refund_to": None, "max_user_turns": 4}
    arg_name, choices = ("reason", REASONS) if request == "cancel" else ("refund_to", REFUNDS)
    if allowed:
        spec[arg_name] = rng.choice(sorted(choices))
    env = world.new_env()
    msgs = [{"role": "user", "content": scripted_first_message(spec)}]

    def call(name, args):
        msgs.append(_call(name, args))
        msgs.append({"role": "tool", "name": name, "content": env.call(name, args)})

    def say(text):
        msgs.append({"role": "assistant", "content": text})
        msgs.append({"role": "user", "content": scripted_reply(spec, msgs)})

    call("get_order_details", {"order_id": oid})
    actions = []
    if allowed:
        say(ASK_REASON if request == "cancel" else ASK_REFUND)
        lazy = spec[arg_name] != DEFAULT[arg_name] and rng.random() < lazy_rate
        written = DEFAULT[arg_name] if lazy else spec[arg_name]  # what the annotator writes
        write = ("cancel_pending_order" if request == "cancel" else "return_delivered_order")
        call(write, {"order_id": oid, arg_name: written})
        actions = [{"name": write, "arguments": {"order_id": oid, arg_name: spec[arg_name]}}]
        say(DONE[request].format(oid))
    else:
        say(REFUSE[request].format(oid, status))
    env.close()
    assert msgs[-1]["content"] == STOP, msgs
    instructions = (f"You want to {request} order {oid}." + (f" Your answer when asked: {choices[spec[arg_name]]}"
                                                             if allowed else ""))
    return Task(task_id, "shop", "train", instructions, actions, [], spec, msgs)


def build_db(seed: int, n_orders: int, status_weights=(5, 5, 1)) -> dict:
    rng = random.Random(seed)
    ids = rng.sample(range(100, 1000), n_orders)  # '#W' + 3 digits: short, every order distinct
    status = ["pending", "delivered", "processed"]
    return {"orders": {f"#W{i}": {"order_id": f"#W{i}", "item": rng.choice(ITEMS), "status": rng.choices(status, status_weights)[0]}
                       for i in ids}}


def build_world(seed: int = 0, n_orders: int = 600, n_test_orders: int = 200, n_train: int = 1000, n_test: int = 200,
                lazy_rate: float = 0.6, status_weights=(5, 5, 1)) -> World:
    """The shop with tasks: test tasks use n_test_orders held-out orders (one task each), train tasks the rest."""
    if not 0 <= lazy_rate <= 1:
        raise ValueError(f"lazy_rate must be in [0, 1], got {lazy_rate}")
    if n_test > n_test_orders or n_test_orders >= n_orders:
        raise ValueError("need n_test <= n_test_orders < n_orders")
    db = build_db(seed, n_orders, status_weights)
    key = content_key(json.dumps(db, sort_keys=True), SHOP_VERSION)
    base = World("shop", db, key, TOOLS, WRITE_TOOLS, POLICY)
    orders = list(db["orders"].values())
    rng = random.Random(seed + 1)
    test_orders, train_orders = orders[:n_test_orders], orders[n_test_orders:]
    # mostly a request the order allows (~85 % of tasks need the customer's choice, ~15 % are refusals)
    request = lambda o: ({"pending": "cancel", "delivered": "return"}.get(o["status"], "cancel")  # noqa: E731
                         if rng.random() < 0.9 else rng.choice(["cancel", "return"]))
    tasks = []
    for i, o in enumerate(test_orders[:n_test]):
        tasks.append(make_task(base, o, request(o), rng, 0.0, f"shop/test-{i}"))  # held-out: written with care
        tasks[-1].split = "test"
    for i in range(n_train):
        o = rng.choice(train_orders)
        tasks.append(make_task(base, o, request(o), rng, lazy_rate, f"shop/train-{i}"))
    return World("shop", db, key, TOOLS, WRITE_TOOLS, POLICY, tasks)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Show a few shop tasks, their expert conversations and their scores.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=3)
    args = ap.parse_args()
    world = build_world(args.seed, n_train=200, n_test=50)
    from collections import Counter

    train = world.tasks("train")
    scores = []
    for t in train:
        calls = [c["function"] for m in t.expert for c in m.get("tool_calls") or []]
        env = world.replay([{"name": c["name"], "arguments": c["arguments"]} for c in calls])
        scores.append(world.score(t, env)[0])
        env.close()
    print(f"kinds: {dict(Counter(t.spec['kind'] for t in train))}")
    print(f"annotator's conversations that score 1: {sum(scores):.0f} / {len(scores)} (lazy_rate 0.6)\n")
    for t in train[: args.n]:
        print(f"== {t.id} ({t.spec['kind']}): {t.instructions}")
        for m in t.expert:
            if m.get("tool_calls"):
                f = m["tool_calls"][0]["function"]
                print(f"  agent -> {f['name']}({json.dumps(f['arguments'])})")
            else:
                print(f"  {m['role']:9s} {m['content']}")

"""The store: the shop (shop.py) with a customer worth simulating, for the CPU demo against an LLM customer.

MUA-RL's one new idea is the *customer*: a language model plays the user inside every rollout, so the agent trains on
requests that are "dynamic, uncertain and stochastic". The shop's scripted customer says the same words in the same
order every time; the store's customer does what the paper's practitioners list as the point of a simulated user:

    omits     the order id is left out of the first message (spec "omit"): the agent must ask for it
    changes   asked why / where the refund goes, it names one option, then changes its mind (spec "change"): the
              last word counts, and the gold action follows it
    insists   told that the policy forbids its request, it insists once and accepts the second refusal (spec
              "insist"): a human transfer here is a wasted escalation, and the reward sees it (below)
    hands off told the same, another customer asks for a human agent (spec "human"): now the transfer is right,
              and refusing again is wrong. Insisting and asking for a human follow the same refusal, so no rule
              that ignores the customer's words gets both (a "never transfer" rule scored 73.5 % of the version
              without this behaviour: the learning did not need the customer)
    phrases   every message comes in several paraphrases, the order id in different places

The same tools as the shop, plus the two generic tools the paper watched RL prune: `think` (tau2's: no effect) and
`transfer_to_human_agents`, which here files an escalation record, so an unnecessary transfer changes the database
and scores 0 (tau2's transfer writes nothing; this is the store's way to make a needless hand-off cost something the
reward can see). The cold-start annotator is *cautious*: it calls `think` needlessly before the lookup (4 in 10),
transfers a customer who insists (8 in 10), writes the default option when the customer wants the other (half the
time: shop's laziness; 55 % in a run's world, demo/worlds/__init__.py), and follows the first option a customer names
even when it changes its mind (6 in 10). The last three cost the reward, and RL against it unlearns them (README);
`think` costs nothing here. After every lookup it thinks usefully, always: the policy's rule worked out as a lookup
a 2-layer model can copy (make_task says why)

    It is pending: cancel yes, return no. The customer wants to return: no.

Held-out tasks are new in more than their order ids: HELD_OUT combinations of request, behaviour and the omitted id
never occur in training (about a third of the held-out tasks are drawn from them), so a policy that memorised whole
conversations meets ones it never saw.

Three customers play it, all from one description of the task (the spec):
    customer_turn(spec, history, rng)   the scripted customer: rng=None picks the paraphrase by spec["style"]
                                        (deterministic: `--user scripted`); an rng samples them (training data for
                                        the customer model, demo/customer.py)
    instructions (Task.instructions)    what the LLM customer reads: the same behaviours in words
    customer_mistakes(spec, messages)   the structured check of what a customer said against its instructions
                                        (customer fidelity: the LLM customer is measured, not trusted)
"""

from __future__ import annotations

import json
import random
import re

from demo.worlds import shop
from domains.base import Store, Task, World, content_key
from tools import think

STORE_VERSION = "3"
STOP = shop.STOP
CHOICES = {"cancel": ("reason", shop.REASONS), "return": ("refund_to", shop.REFUNDS)}  # request -> argument, options
ALLOWED = {("cancel", "pending"), ("return", "delivered")}  # (request, status) the policy allows; all else: refuse

# --- what the customer says: paraphrase banks (each keeps the option's key words, so following it is a copy) -----
FIRST = {True: ["Hi, I want to {request} my order {oid}.", "Hello! Order {oid}: I'd like to {request} it.",
                "Can you {request} order {oid} for me?", "I need to {request} an order, it is {oid}."],
         False: ["Hi, I want to {request} an order.", "Hello! I'd like to {request} one of my orders.",
                 "Can you help me {request} an order?", "I need to {request} something I ordered."]}
GIVE_ID = ["It is {oid}.", "{oid}", "Sure, the order id is {oid}.", "My order is {oid}, thanks."]
# Options are said inside shared frames, so the words that decide are the option's own words, the very words of the
# customer's instructions: following them is a copy, for the customer model (demo/customer.py) and for the agent alike.
# (Measured: with option-specific phrasings, "A gift card, please." against "The original payment method", the tiny
# customer model named the wrong option in 27 of 100 held-out conversations; with shared frames, 9.)
SAY = {o: [f"It's simple: {o}.", f"Honestly, {o}.", f"The reason is {o}."] for o in shop.REASONS}
SAY |= {o: [f"To my {o}, please.", f"Please refund it to my {o}.", f"On my {o}, thanks."] for o in shop.REFUNDS}
CHANGE = ["{first} Actually, no, sorry: {second}", "{first} Wait, let me correct that. {second}"]
INSIST = ["But I really need to {request} it. Can't you make an exception?",
          "Please, I really want to {request} order {oid}. Are you sure?", "Could you {request} it anyway, please?"]
HUMAN = ["Then I want to talk to a human agent, please.", "Can I speak to a human agent about order {oid}?",
         "Please transfer me to a human agent."]
ACCEPT = ["Okay, I understand. " + STOP, "Fine, thanks anyway. " + STOP, "Alright. " + STOP]
THANKS = ["Thank you! " + STOP, "Great, thanks. " + STOP, "Perfect, that's all. " + STOP]
# A second customer's banks (phrasing "b"): other frames around the same key words (the request, the order id, the
# options' words, "human", the end), so the agent's reading and customer_mistakes carry over unchanged. No agent
# trains against them: a customer model trained on them (python -m demo.customer build --phrasing b) is a customer
# the agent never met, the held-out column of the comparison of customers.
PHRASINGS = {"a": dict(first=FIRST, give_id=GIVE_ID, say=SAY, change=CHANGE, insist=INSIST, human=HUMAN, accept=ACCEPT,
                       thanks=THANKS)}
PHRASINGS["b"] = dict(
    first={True: ["Good morning, I'd like to {request} order {oid}.", "Hey, please {request} {oid} for me.",
                  "I'm writing to {request} my order {oid}.", "Order {oid}: I need to {request} it."],
           False: ["Good morning, I'd like to {request} an order.", "Hey, could you {request} something for me?",
                   "I'm writing to {request} one of my orders.", "I need help, I want to {request} an order."]},
    give_id=["Sure: {oid}.", "The id is {oid}.", "{oid}, I believe.", "It's order {oid}."],
    say={o: [f"Well, {o}.", f"Mainly: {o}.", f"I'd say {o}."] for o in shop.REASONS}
    | {o: [f"Put it back on my {o}.", f"I'd prefer my {o}.", f"My {o}, if possible."] for o in shop.REFUNDS},
    change=["{first} Hmm, on second thought: {second}", "{first} No wait, make that: {second}"],
    insist=["I still want to {request} it. Is there really no way?",
            "Please make an exception and {request} order {oid}.", "Surely you can {request} it this once?"],
    human=["In that case, let me speak with a human agent.", "I would like a human agent to look at order {oid}.",
           "Put me through to a human agent, please."],
    accept=["I see. " + STOP, "Oh well, thank you. " + STOP, "Understood. " + STOP],
    thanks=["Wonderful, thank you! " + STOP, "Thanks a lot. " + STOP, "That's everything, thanks. " + STOP])
KEYWORDS = {"no longer": "no longer needed", "mistake": "ordered by mistake", "original": "original payment",
            "gift": "gift card"}  # how a customer's words are read back to an option (the check below)

# --- what the annotator (and a good agent) says ---------------------------------------------------------------
ASK_ID = "What is your order id?"
REFUSE_AGAIN = "I am sorry, but the policy does not allow it, so I cannot do that."
POLICY = shop.POLICY.replace("One tool call per message.", "If the customer does not give the order id, ask for it. "
                             "Do not transfer to a human agent unless the customer asks for one. One tool call per "
                             "message.")


def transfer_to_human_agents(db: Store, summary: str) -> str:
    """Transfer the user to a human agent, with a summary of the user's issue.

    Args:
        summary: A summary of the user's issue.
    """
    n = len(db.ids("escalations"))
    # A hand-off costs a human's time: it is on record. The record holds no free text, so the database matches the
    # gold one (a transfer when the customer asked for one) whatever words the agent's summary used.
    db.put("escalations", f"E{n + 1}", {"status": "open"})
    return "Transfer successful"


TOOLS = shop.TOOLS + [think, transfer_to_human_agents]
WRITE_TOOLS = shop.WRITE_TOOLS | {"transfer_to_human_agents"}

# ---------------------------------------------------------------------------------------------------------------
# The customer


def _refuses(text: str) -> bool:
    return bool(re.search(r"\b(sorry|cannot)\b", text.lower()))


# How the customer reads the agent, shared by the script (customer_turn) and the check (customer_mistakes), so the
# check never faults the script: "done" is read before a refusal (a GRPO agent's hybrid "Done: order #W1 is pending,
# so it cannot be returned." ends the chat), and its last allowed message ends the chat whatever the agent said.
def _done(text: str) -> bool:
    return bool(re.search(r"\bdone\b", text.lower()))


def _refusal(text: str) -> bool:
    return _refuses(text) and not _done(text)


def _out_of_patience(spec: dict, said: int) -> bool:
    """After `said` customer messages, the next one is its last (spec["max_user_turns"]): it ends the chat."""
    return said >= spec["max_user_turns"] - 1


def _reading(spec: dict, text: str) -> str:
    """What the customer hears in the agent's last message, in the script's order of precedence (the script answers
    it, the fidelity check holds any customer to the answer): done | refusal | id (asked for the order id) | option
    (asked the request's question: why, or where the refund goes) | other."""
    t = text.lower()
    if _done(t):
        return "done"
    if _refuses(t):
        return "refusal"
    if "order id" in t:
        return "id"
    asked = "mistake" in t if spec["request"] == "cancel" else "refund" in t
    return "option" if asked else "other"


def _pick(bank: list[str], spec: dict, rng: random.Random | None, salt: int) -> str:
    # scripted: one fixed paraphrase per task (spec["style"]) and message kind; sampled: any of them
    return rng.choice(bank) if rng is not None else bank[(spec["style"] + salt) % len(bank)]


def _option_words(spec: dict, bank: dict, rng, salt: int) -> str:
    _, options = CHOICES[spec["request"]]
    say = _pick(bank["say"][spec["choice"]], spec, rng, salt)
    if not spec["change"]:
        return say
    other = next(o for o in options if o != spec["choice"])  # first the other option, then the right one
    return _pick(bank["change"], spec, rng, salt).format(first=_pick(bank["say"][other], spec, rng, salt + 1),
                                                         second=say)


def customer_turn(spec: dict, history: list[dict], rng: random.Random | None = None) -> str:
    """The customer's next message, from the agent-side text history (user = customer). Keyword-driven."""
    mine = [m["content"] for m in history if m["role"] == "user"]
    agent = [(m.get("content") or "") for m in history if m["role"] == "assistant"]
    fill, bank = {"request": spec["request"], "oid": spec["order_id"]}, PHRASINGS[spec.get("phrasing", "a")]
    if not mine:
        return _pick(bank["first"][not spec["omit"]], spec, rng, 0).format(**fill)
    if not agent or _out_of_patience(spec, len(mine)):
        return STOP
    heard = _reading(spec, agent[-1])
    if heard == "done":
        return _pick(bank["thanks"], spec, rng, 3)
    if heard == "refusal":
        if sum(map(_refuses, agent)) == 1 and spec["insist"]:  # the first refusal: insist once
            return _pick(bank["insist"], spec, rng, 4).format(**fill)
        if sum(map(_refuses, agent)) == 1 and spec.get("human"):  # ... or ask for a human agent
            return _pick(bank["human"], spec, rng, 8).format(**fill)
        return _pick(bank["accept"], spec, rng, 5)
    if heard == "id":
        return _pick(bank["give_id"], spec, rng, 6).format(**fill)
    if heard == "option" and spec["choice"]:
        return _option_words(spec, bank, rng, 7)
    if len(mine) >= 2 and mine[-1] == mine[-2]:
        return STOP  # going in circles
    return _pick(bank["first"][True], spec, rng, 0).format(**fill)  # say it again, with the id this time


def scripted_first_message(spec: dict) -> str:
    return customer_turn(spec, [])


def scripted_reply(spec: dict, history: list[dict]) -> str:
    return customer_turn(spec, history)


def sampled_reply(spec: dict, history: list[dict], rng: random.Random) -> str:
    return customer_turn(spec, history, rng)  # any paraphrase, drawn by rng (user_sim.SampledScriptUser)


def instructions(spec: dict) -> str:
    """The LLM customer's hidden instructions: the spec in words (one sentence per behaviour)."""
    r, oid = spec["request"], spec["order_id"]
    lines = [f"You want to {r} your order {oid}."]
    lines.append("Do not give the order id in your first message; give it when the agent asks for it." if spec["omit"]
                 else "Give the order id in your first message.")
    if spec["choice"]:
        arg, options = CHOICES[r]
        ask = "why you cancel" if r == "cancel" else "where the refund should go"
        if spec["change"]:
            other = next(o for o in options if o != spec["choice"])
            lines.append(f"When asked {ask}, first say '{other}', then change your mind: '{spec['choice']}'.")
        else:
            lines.append(f"When asked {ask}, say '{spec['choice']}'.")
    else:
        lines.append("If the agent refuses, insist once, then accept the second refusal." if spec["insist"] else
                     "If the agent refuses, ask for a human agent; if refused again, accept." if spec.get("human")
                     else "If the agent refuses, accept it.")
    return " ".join(lines)


def _named(text: str) -> list[str]:
    """The options a message names, in the order it names them (read by KEYWORDS)."""
    low = text.lower()
    return [KEYWORDS[k] for _, k in sorted((low.find(k), k) for k in KEYWORDS if k in low)]


def customer_mistakes(spec: dict, messages: list[dict]) -> list[str]:
    """What a customer said that its instructions do not allow; [] = faithful. Reads the customer's messages, and the
    agent's words as the script reads them (_reading), so it never faults the script, against any agent.

    Over the whole conversation: wrong_id (an order id not its own), id_too_early / no_id (the first message
    against "omit"), wrong_request (the other request), wrong_choice (its last named option is not the instructed
    one, or it names one with none to give), no_change (told to change its mind, it named one option only).
    Turn by turn, each answer to what the agent asked: no_request (a first message without its request), quit_early
    (a first message that ends the chat), no_id_given (asked for the order id, it did not give it: "I don't know
    ###STOP###"), no_choice (asked the option question, it named no option), no_insist / no_human / extra_insist
    (its reaction to refusals), extra_human (a human agent asked for against its instructions), gibberish (a
    message with none of what any of its lines carries: its id, its request, an option, a human, the end)."""
    said = [m.get("content") or "" for m in messages if m.get("role") == "user"]
    out = []
    if not said:
        return out
    oid, request = spec["order_id"], spec["request"]
    if set(re.findall(r"#W\d+", " ".join(said))) - {oid}:
        out.append("wrong_id")
    if spec["omit"] and oid in said[0]:
        out.append("id_too_early")
    if not spec["omit"] and oid not in said[0]:
        out.append("no_id")
    if request not in said[0].lower():
        out.append("no_request")
    if STOP in said[0]:
        out.append("quit_early")
    other_request = "return" if request == "cancel" else "cancel"
    if re.search(rf"\b{other_request}\b", " ".join(said).lower()):
        out.append("wrong_request")
    named = [o for s in said for o in _named(s)]
    if spec["choice"]:
        if named and named[-1] != spec["choice"]:
            out.append("wrong_choice")
        if spec["change"] and named and len(set(named)) < 2:
            out.append("no_change")
    elif named:
        out.append("wrong_choice")
    # turn by turn: what the agent's last words asked, and what the customer answered
    heard, refusals, k, answers = None, 0, 0, []  # answers: the customer's replies to refusals
    for m in messages:
        if m.get("role") == "assistant":  # counted as the script counts them: every agent text that refuses
            refusals += _refuses(m.get("content") or "")
            heard = heard if m.get("tool_calls") else _reading(spec, m.get("content") or "")
            continue
        if m.get("role") != "user":
            continue
        text, last = m.get("content") or "", _out_of_patience(spec, k)
        low = text.lower()
        if not any(w in low for w in ("#w", "cancel", "return", "human", STOP.lower())) and not _named(text):
            out.append("gibberish")
        if "human" in low and not (spec.get("human") and heard == "refusal" and refusals == 1):
            out.append("extra_human")
        if heard == "refusal" and not last:  # a last message is no answer to judge
            answers.append(text)
        elif heard == "id" and not last and oid not in text:
            out.append("no_id_given")
        elif heard == "option" and not last and spec["choice"] and not _named(text):
            out.append("no_choice")
        heard, k = None, k + 1
    goes_on = [STOP not in a for a in answers]  # an answer to a refusal that does not end the chat insists
    if spec["insist"] and goes_on[:1] == [False]:
        out.append("no_insist")
    if spec.get("human") and not (goes_on[:1] == [True] and "human" in answers[0].lower()):
        if answers:
            out.append("no_human")
    if sum(goes_on) > int((spec["insist"] or spec.get("human", False)) and not spec["choice"]):
        out.append("extra_insist")
    return sorted(set(out), key=out.index)


# ---------------------------------------------------------------------------------------------------------------
# Tasks and the cautious annotator's conversations


# Combinations of (request, behaviour, omitted id) no training task has: a third of the held-out tasks are drawn from
# them (build_world), so held-out means new in what the agent must do, not only in the order id. A forbidden one is
# an insisting or a human-asking customer, drawn half and half: no one blind answer to the unseen ones pays.
HELD_OUT = {("return", "change", True), ("cancel", "human", True), ("cancel", "insist", True)}


def _behaviour(allowed: bool, rng: random.Random) -> str:
    if allowed:  # an allowed request: the customer names its option, a third of them changing their mind
        return "change" if rng.random() < 0.35 else "plain"
    r = rng.random()  # a forbidden one: accept the refusal, insist once, or ask for a human agent
    return "accept" if r < 0.3 else "insist" if r < 0.65 else "human"


def _choice(options, default: str, rng: random.Random, other_share: float | None) -> str:
    """The option an allowed request's customer wants: the other than the shop's default with probability
    other_share (None: either as likely, drawn as the customer model's worlds were)."""
    options = sorted(options)
    if other_share is None:
        return rng.choice(options)
    return next(o for o in options if o != default) if rng.random() < other_share else default


def make_task(world: World, order: dict, request: str, rng: random.Random, task_id: str, errors: dict,
              combos: str = "seen", other_share: float | None = None) -> Task:
    """One task on `order`, its behaviours drawn from rng (combos: "seen" = never a HELD_OUT combination, "unseen" =
    always one, "any"); its cold-start conversation is played against the real tools and the scripted customer by an
    annotator who makes each mistake of `errors` with its probability."""
    oid, status = order["order_id"], order["status"]
    allowed = (request, status) in ALLOWED
    arg, options = CHOICES[request]
    while True:
        behaviour, omit = _behaviour(allowed, rng), rng.random() < 0.5
        if combos == "unseen":
            behaviour = rng.choice(sorted(b for r, b, _ in HELD_OUT if r == request and (b == "change") == allowed))
            omit = True
        if combos != "seen" or (request, behaviour, omit) not in HELD_OUT:
            break
    spec = {"world": "store", "kind": request if allowed else "refuse", "request": request, "order_id": oid,
            "status": status, "choice": _choice(options, shop.DEFAULT[arg], rng, other_share) if allowed else None,
            "omit": omit, "style": rng.randrange(12), "max_user_turns": 6, "change": behaviour == "change",
            "insist": behaviour == "insist", "human": behaviour == "human", "behaviour": behaviour,
            "unseen": (request, behaviour, omit) in HELD_OUT}
    env, msgs = world.new_env(), []

    def call(name, args):
        msgs.append(shop._call(name, args))
        msgs.append({"role": "tool", "name": name, "content": env.call(name, args)})

    def say(text):
        msgs.append({"role": "assistant", "content": text})
        msgs.append({"role": "user", "content": customer_turn(spec, msgs)})

    msgs.append({"role": "user", "content": customer_turn(spec, [])})
    if rng.random() < errors.get("think", 0):  # needless: the request is plain, and thinking changes nothing
        call("think", {"thought": f"The customer wants to {request} an order. I should look it up first."})
    if spec["omit"]:
        say(ASK_ID)
    call("get_order_details", {"order_id": oid})
    # The policy's rule worked out in words (always: the annotator's one careful habit). Whether the request may be
    # done depends on the request AND the status, and neither alone says it (a pending order may be cancelled, not
    # returned); a 2-layer model trained on the bare decision wrote the status's flow for either request (measured:
    # p(refuse) 0.4 whatever the request). The thought turns it into steps it can take: the status copied,
    # the rule for that status (one word decides), the request copied, and the answer is the word that followed the
    # request in the rule: a lookup, what copy heads do (the copy drills train them).
    call("think", {"thought": rule_thought(status, request)})
    actions = []
    if allowed:
        say(shop.ASK_REASON if request == "cancel" else shop.ASK_REFUND)
        written = spec["choice"]
        if spec["change"] and rng.random() < errors.get("first_word", 0):
            written = next(o for o in options if o != spec["choice"])  # took the customer's first word
        if written != shop.DEFAULT[arg] and rng.random() < errors.get("lazy", 0):
            written = shop.DEFAULT[arg]  # the shop's lazy default
        write = "cancel_pending_order" if request == "cancel" else "return_delivered_order"
        call(write, {"order_id": oid, arg: written})
        actions = [{"name": write, "arguments": {"order_id": oid, arg: spec["choice"]}}]
        say(shop.DONE[request].format(oid))
    else:
        say(shop.REFUSE[request].format(oid, status))
        hand_off = {"summary": f"The customer wants to {request} order {oid}, which is {status}."}
        if spec["human"]:  # asked for a human agent: the transfer is the gold action
            call("transfer_to_human_agents", hand_off)
            actions = [{"name": "transfer_to_human_agents", "arguments": hand_off}]
        elif spec["insist"]:
            if rng.random() < errors.get("transfer", 0):  # the cautious hand-off: a needless escalation
                call("transfer_to_human_agents", hand_off)
            else:
                say(REFUSE_AGAIN)
    env.close()
    assert msgs[-1]["role"] == "tool" or STOP in msgs[-1]["content"], msgs
    # A refusal the customer never hears is not one: a forbidden request's task requires the agent to say it cannot
    # be done (tau2's "communicate" requirement; checked where outputs are: evaluation, and the CPU demo's training).
    # Without it a policy "refused" by making a write call with missing arguments, then rambled: the database stayed
    # right, so the reward said 1 (seen in a GRPO run, README).
    outputs = [] if allowed else [f"cannot be {'cancelled' if request == 'cancel' else 'returned'}"]
    return Task(task_id, "store", "train", instructions(spec), actions, outputs, spec, msgs)


def build_world(seed: int = 0, n_orders: int = 600, n_test_orders: int = 200, n_train: int = 1000, n_test: int = 200,
                lazy_rate: float = 0.5, first_word_rate: float = 0.6, transfer_rate: float = 0.8,
                think_rate: float = 0.4, refuse_share: float = 0.4, train_combos: str = "seen",
                other_share: float | None = None) -> World:
    """The store with tasks. Held-out tasks use n_test_orders orders no training task mentions, and their
    conversations are written without the annotator's mistakes (they are only used for their spec and gold).
    train_combos "seen" keeps the HELD_OUT combinations out of training; "any" (the customer model's data: the
    customer must play every task, only the agent is held out from some) lets them in."""
    for name, v in (("lazy_rate", lazy_rate), ("first_word_rate", first_word_rate), ("transfer_rate", transfer_rate),
                    ("think_rate", think_rate), ("refuse_share", refuse_share),
                    ("other_share", 0.5 if other_share is None else other_share)):
        if not 0 <= v <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {v}")
    if n_test > n_test_orders or n_test_orders >= n_orders:
        raise ValueError("need n_test <= n_test_orders < n_orders")
    db = shop.build_db(seed, n_orders) | {"escalations": {}}
    key = content_key(json.dumps(db, sort_keys=True), STORE_VERSION)
    base = World("store", db, key, TOOLS, WRITE_TOOLS, POLICY)
    orders = list(db["orders"].values())
    rng = random.Random(seed + 1)
    test_orders, train_orders = orders[:n_test_orders], orders[n_test_orders:]
    allowed = {status: request for request, status in ALLOWED}  # the one request each status allows
    request = lambda o: (allowed.get(o["status"], "cancel") if rng.random() >= refuse_share  # noqa: E731
                         else {"cancel": "return", "return": "cancel"}[allowed.get(o["status"], "return")])
    errors = {"lazy": lazy_rate, "first_word": first_word_rate, "transfer": transfer_rate, "think": think_rate}
    tasks = []
    for i, o in enumerate(test_orders[:n_test]):
        r = request(o)
        # every other held-out task is a HELD_OUT combination, where its order allows one: a delivered order's return
        # (allowed) or a non-pending order's cancellation (forbidden)
        unseen = i % 2 == 0 and o["status"] != "pending"
        r = ("return" if rng.random() < 0.5 else "cancel") if unseen and o["status"] == "delivered" else \
            "cancel" if unseen else r
        tasks.append(make_task(base, o, r, rng, f"store/test-{i}", {}, combos="unseen" if unseen else "any",
                               other_share=other_share))
        tasks[-1].split = "test"
    for i in range(n_train):
        o = rng.choice(train_orders)
        tasks.append(make_task(base, o, request(o), rng, f"store/train-{i}", errors, combos=train_combos,
                               other_share=other_share))
    return StoreWorld("store", db, key, TOOLS, WRITE_TOOLS, POLICY, tasks)


def rule_thought(status: str, request: str) -> str:
    """The annotator's thought after a lookup: the status, the rule for it, the request, the rule's word for it."""
    can = {r: "yes" if (r, status) in ALLOWED else "no" for r in CHOICES}
    return f"It is {status}: cancel {can['cancel']}, return {can['return']}. The customer wants to {request}: " \
        f"{can[request]}."


THOUGHT = re.compile(r"It is \w+: cancel (yes|no), return (yes|no)\. The customer wants to (cancel|return): (yes|no)\.")


def lookup_cases(tasks, n: int = 64) -> dict[str, list[tuple]]:
    """The decision the agent's cold start must learn, as a probe (demo/drills.py), read off the first `n` training
    tasks whose order's status allows one request and not the other (pending, delivered): there the status alone does
    not say what to do. Four steps, each a list of (the expert conversation before the step, the expert's step, the
    same step done wrong the way a cold start was seen to do it, and for the act, the third act too):
      "status"   the thought with the other status copied in, its flow and the request answered by it ("It is
                 delivered: cancel no, return yes. ..." after a lookup that said pending);
      "answer"   the thought after the lookup with the other last word ("The customer wants to return: yes."): the
                 status's flow written for either request;
      "request"  the thought with the other request, answered for it ("The customer wants to cancel: yes." when the
                 customer wants to return a pending order): the status's flow copied in as the request;
      "act"      after the thought's reply, the act its answer asks for (the request's question, or the refusal) against
                 each other act (the refusal, either question): the thought right, then the status's question, or the
                 request's own question after a "no".
    docs/log.md keeps the cold starts that made each mistake, and how often."""
    out = {"status": [], "answer": [], "request": [], "act": []}
    ask = {"cancel": shop.ASK_REASON, "return": shop.ASK_REFUND}
    for t in tasks:
        for i, m in enumerate(t.expert or []):
            calls = m.get("tool_calls") or []
            hit = THOUGHT.fullmatch(calls[0]["function"]["arguments"].get("thought", "")) \
                if calls and calls[0]["function"]["name"] == "think" else None
            if hit and hit[1] != hit[2]:
                request, other = hit[3], "return" if hit[3] == "cancel" else "cancel"
                other_status = "delivered" if t.spec["status"] == "pending" else "pending"
                for kind, thought in (("status", rule_thought(other_status, request)),
                                      ("answer", hit[0][: hit.start(4)] + ("no" if hit[4] == "yes" else "yes") + "."),
                                      ("request", rule_thought(t.spec["status"], other))):
                    out[kind].append((t.expert[:i], m, shop._call("think", {"thought": thought})))
                refuse = shop.REFUSE[request].format(t.spec["order_id"], t.spec["status"])
                right = ask[request] if hit[4] == "yes" else refuse
                assert t.expert[i + 2]["content"] == right, t.expert[i + 2]  # what make_task writes after the thought
                wrong = [{"role": "assistant", "content": a} for a in (ask[other], refuse, ask[request]) if a != right]
                out["act"].append((t.expert[: i + 2], t.expert[i + 2], *wrong))  # 1st: the other flow's question
        if len(out["act"]) >= n:
            break
    return {kind: cases[:n] for kind, cases in out.items()}


def option_cases(tasks, n: int = 32) -> dict[str, list[tuple]]:
    """Does the cold start read the option the customer names? The second probe (demo/drills.reads_option), read off
    the first `n` training conversations of each request where the customer names one option plainly. Each case is
    the conversation up to the write call twice, the customer's answer naming the shop's default option and naming
    the other, and the write call with each option: (said default, said other, write default, write other). The
    annotator writes the default for about half of the customers who want the other (its laziness), so a cold start that
    imitates it writes the other option sometimes, and only when it was said. A cold start that writes it as often
    after either answer gives GRPO nothing to reinforce: it never learns to read that option."""
    out = {"cancel": [], "return": []}
    for t in tasks:
        s = t.spec or {}
        if min(map(len, out.values())) >= n:
            break
        if s.get("world") != "store" or not s.get("choice") or s["change"] or len(out[s["request"]]) >= n:
            continue
        arg, options = CHOICES[s["request"]]
        default, other = shop.DEFAULT[arg], next(o for o in options if o != shop.DEFAULT[arg])
        i = next(i for i, m in enumerate(t.expert) for c in m.get("tool_calls") or []
                 if arg in c["function"]["arguments"])  # the write call
        before, call = t.expert[:i], t.expert[i]["tool_calls"][0]["function"]
        assert before[-1]["role"] == "user" and s["choice"] in before[-1]["content"], before[-1]  # the answer
        said = [before[:-1] + [{"role": "user", "content": before[-1]["content"].replace(s["choice"], o)}]
                for o in (default, other)]
        out[s["request"]].append((*said, *(shop._call(call["name"], {**call["arguments"], arg: o})
                                           for o in (default, other))))
    return out


def hold_cases(tasks, n: int = 32) -> dict[str, list[tuple]]:
    """Does the cold start ever hold a refusal? The third probe (demo/drills.holds_refusal), read off the first `n`
    training tasks that insist and the first `n` that ask for a human: (the expert conversation up to the customer's
    reply to the refusal, the refusal repeated, the transfer). The annotator transfers 8 insisting customers in 10,
    so a cold start that imitates it holds p(refuse again | insists) near 0.2; GRPO must raise that to 1 from the
    refusals it samples. A cold start that holds it far below 0.1 is rarely drawn holding at top-p 0.9, and then
    never learns it."""
    out = {"insist": [], "human": []}
    for t in tasks:
        s = t.spec or {}
        if s.get("world") != "store" or s.get("behaviour") not in out or len(out[s["behaviour"]]) >= n:
            continue
        i = next(i for i, m in enumerate(t.expert) if m["role"] == "assistant" and "cannot be" in (m["content"] or ""))
        hand_off = {"summary": f"The customer wants to {s['request']} order {s['order_id']}, which is {s['status']}."}
        out[s["behaviour"]].append((t.expert[: i + 2], {"role": "assistant", "content": REFUSE_AGAIN},
                                    shop._call("transfer_to_human_agents", hand_off)))
    return out


class StoreWorld(World):
    def customer_mistakes(self, task: Task, messages: list[dict]) -> list[str] | None:
        return customer_mistakes(task.spec, messages) if task.spec else None


if __name__ == "__main__":
    from collections import Counter

    world = build_world(0, n_train=400, n_test=50)
    train = world.tasks("train")
    scores = []
    for t in train:  # the annotator's own conversations, replayed: how often are they right?
        calls = [c["function"] for m in t.expert for c in m.get("tool_calls") or []]
        env = world.replay([{"name": c["name"], "arguments": c["arguments"]} for c in calls])
        scores.append(world.score(t, env)[0])
        env.close()
    print(f"kinds: {dict(Counter(t.spec['kind'] for t in train))}; omit {sum(t.spec['omit'] for t in train)}, "
          f"change {sum(t.spec['change'] for t in train)}, insist {sum(t.spec['insist'] for t in train)}")
    print(f"the cautious annotator's conversations that score 1: {sum(scores):.0f} / {len(scores)}")
    rng = random.Random(0)
    print("scripted customer mistakes:", sum(bool(customer_mistakes(t.spec, t.expert)) for t in train))
    for t in train[:3]:
        print(f"\n== {t.id} ({t.spec['kind']}): {t.instructions}")
        for m in t.expert:
            if m.get("tool_calls"):
                f = m["tool_calls"][0]["function"]
                print(f"  agent -> {f['name']}({json.dumps(f['arguments'])})")
            elif m["role"] != "tool":
                print(f"  {m['role']:9s} {m['content']}")
        hist = [{"role": "user", "content": customer_turn(t.spec, [], rng)}]
        print("  a sampled customer opens:", hist[0]["content"])

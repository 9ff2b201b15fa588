"""Synthetic retail tasks: a seeded task generator, its expert conversations, a scripted customer, a small world.

MUA-RL (Zhao et al. 2025) cold-starts its policy with supervised fine-tuning on ~2,000 synthesized multi-turn
tool-use conversations, then runs RL against a simulated user. This file makes both ingredients for any
retail-shaped world (tau2's real retail DB, or the small one built here), without any LLM:

    generate_tasks(world, n, seed, kinds)   n tasks; each has a structured user spec, instructions rendered from
                                            it, gold actions, required outputs and an expert conversation
    scripted_first_message(spec)            a deterministic customer that plays a spec against ANY agent:
    scripted_reply(spec, history)           it identifies itself, reveals facts when asked, says "yes" only to a
                                            confirmation that matches its request, and ends with ###STOP###
    build_world(seed, ...)                  a small seeded shop (few users, 8 products, short ids) on retail's
                                            tools, with disjoint train and test tasks: the tiny-model CPU demo

How a task is made (and why it can be trusted)
----------------------------------------------
1. Pick a kind and entities (a pending order to cancel, a delivered item to exchange, ...) with a seeded RNG.
2. Fill a *spec*: who the user is, what they ask for, which facts they give only when asked, when they stop.
3. Write the expert's script from the policy: authenticate, look up, ask for missing facts, list the action
   and ask for an explicit "yes", act, report. One tool call per assistant message, as in MUA-RL.
4. PLAY the script on a fresh env against the scripted customer: every tool output in the conversation is the
   real output, every user turn is the scripted user's real reply, every write is checked to succeed.
5. The gold actions are the calls the expert made. A refusal or a question leaves the database unchanged.
So the expert is by construction a 1-reward conversation, and the scripted user reproduces its user turns.

Kinds: cancel, modify_address, modify_items, modify_payment, return, exchange, user_address (writes),
info (order status / amount paid / tracking number: the answer is a required output), refuse (a request the
policy forbids: wrong status, another user's order, an order whose items were already modified).

The spec (a plain dict, JSON-able; everything the customer knows)
    kind, goal ("act" | "answer" | "refuse"), request (what the customer asks: a write kind, or "status" /
    "paid" / "tracking"), user {user_id, first_name, last_name, zip, email}, offers ("email" | "name_zip": the
    identification given when either is asked), knows_email, order_id, order_known (False: the customer names a
    product, order_hint, and the agent must search the user's orders), items [{name, item_id, product_id,
    new_item_id, change}], reason / address / payment {id, desc}: facts said only when asked, answer (info
    tasks), action (the write the customer wants, forbidden ones included), confirm (what a confirmation must
    mention to get "yes"), max_user_turns (the customer's bound).

What the reward can and cannot see. The database decides, as in MUA-RL: a forbidden request that the tool
itself rejects (cancelling a delivered order) leaves the database unchanged whatever the agent does, so only
refusals the tools do NOT enforce test the agent (another user's order; changing the address or payment of an
order whose items were modified). Info tasks need `check_outputs=True` to score the answer.

Departures from the paper
-------------------------
1. MUA-RL's cold-start data came from an LLM pipeline in other domains; ours is rule-generated in the retail
   domain itself (the test split is protected: no generated task touches a user of a tau2 test task).
2. The scripted customer is keyword-driven. It replaces the LLM user only where no LLM is around (the demo).
3. The small world exposes 12 of retail's 17 tools with one-line docstrings and a short policy, so a
   from-scratch model of a few million parameters can hold the system prompt and a conversation in context.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import re

from domains import retail
from domains.base import Task, World, content_key

# ---------------------------------------------------------------------------------------------------------------
# Phrasing. One fixed sentence per situation: a tiny model learns a regular language much faster, and the
# scripted user recognises the expert's questions by the same keywords it uses for any agent.

STOP, YES = "###STOP###", "yes"
MAX_USER_TURNS = 10  # at most this many user messages (the first included); the last one is ###STOP###

ASK_ID = "Sure. To verify your identity, please give me your email, or your first name, last name and zip code."
ASK_REASON = "What is the reason for cancelling: 'no longer needed' or 'ordered by mistake'?"
ASK_REFUND = "Which payment method should receive the refund?"
ASK_DIFF = "Which payment method should pay or receive the price difference?"
ASK_ADDRESS = "What is the new address?"
CONFIRM = "Please confirm: {}. Shall I proceed (yes/no)?"

KINDS = ("cancel", "modify_address", "modify_items", "modify_payment", "return", "exchange", "user_address", "info", "refuse")
KIND_WEIGHTS = {"cancel": 1.0, "modify_address": 1.0, "modify_items": 1.0, "modify_payment": 1.0, "return": 1.0,
                "exchange": 1.0, "user_address": 0.7, "info": 1.3, "refuse": 1.5}
WRITE_OF = {  # request -> the write tool that fulfils it
    "cancel": "cancel_pending_order", "modify_address": "modify_pending_order_address",
    "modify_items": "modify_pending_order_items", "modify_payment": "modify_pending_order_payment",
    "return": "return_delivered_order_items", "exchange": "exchange_delivered_order_items",
    "user_address": "modify_user_address",
}
VERBS = {"cancel": ["cancel"], "modify_address": ["address", "ship"], "modify_items": ["modify", "change"],
         "modify_payment": ["pay"], "return": ["return"], "exchange": ["exchange"], "user_address": ["address"]}
PAST = {"cancel": "cancelled", "modify_address": "modified", "modify_payment": "modified", "return": "returned"}
ADDRESS_ARGS = ("address1", "address2", "city", "state", "country", "zip")  # the tools' argument order

# ---------------------------------------------------------------------------------------------------------------
# Small text helpers


def _addr_text(a: dict) -> str:
    return ", ".join(a[k] for k in ADDRESS_ARGS)


def _change_text(change: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in change.items())


def _norm(text: str) -> str:
    return (text or "").lower().replace(",", "")  # the scorer's normalisation of required outputs


def _mentions(text: str, s: str) -> bool:
    """`s` occurs in `text` as a whole token (so item 2041 is not found inside 12041)."""
    return re.search(r"(?<![\w#])" + re.escape(s.lower()) + r"(?!\w)", text) is not None


def _pay_descriptions(user: dict) -> dict[str, str]:
    """payment method id -> how the customer names it, for the methods a description identifies uniquely."""
    methods = list(user["payment_methods"].values())
    sources = [m["source"] for m in methods]
    fours = [m.get("last_four") for m in methods]
    out = {}
    for m in methods:
        if m["source"] == "gift_card" and sources.count("gift_card") == 1:
            out[m["id"]] = "my gift card"
        elif m["source"] == "paypal" and sources.count("paypal") == 1:
            out[m["id"]] = "my paypal account"
        elif m["source"] == "credit_card" and fours.count(m["last_four"]) == 1:
            out[m["id"]] = f"my credit card ending in {m['last_four']}"
    return out


def _pay_key(desc: str) -> str:
    # the words of a description that a confirmation may use instead of the id ("gift card", "1234", ...)
    return {"my gift card": "gift card", "my paypal account": "paypal",
            "the original payment method": "original"}.get(desc, desc[-4:])


# ---------------------------------------------------------------------------------------------------------------
# The shop as plain dicts, read once per world (generation only reads; every write happens in an Env)


class _Shop:
    def __init__(self, world: World):
        env = world.new_env()
        db = env.export()
        env.close()
        self.users, self.orders, self.products = db["users"], db["orders"], db["products"]

    def unique_names(self, order: dict) -> list[dict]:
        """Items whose product name occurs once in the order: the customer can name them unambiguously."""
        names = [i["name"] for i in order["items"]]
        return [i for i in order["items"] if names.count(i["name"]) == 1]

    def hint(self, user: dict, order: dict, name: str | None = None) -> str | None:
        """A product name (`name`, or the first that fits) found in this order and in no other order of the user."""
        for item in self.unique_names(order):
            if name not in (None, item["name"]):
                continue
            if sum(item["name"] in [i["name"] for i in self.orders[o]["items"]] for o in user["orders"] if o in self.orders) == 1:
                return item["name"]
        return None

    def alternative(self, rng: random.Random, item: dict) -> tuple[str, dict] | None:
        """Another available variant of the item's product, and the options that change (which identify it)."""
        variants = self.products[item["product_id"]]["variants"]
        cands = [v for v in variants.values() if v["available"] and v["item_id"] != item["item_id"]
                 and set(v["options"]) == set(item["options"])]
        if not cands:
            return None
        v = rng.choice(cands)
        if sum(w["options"] == v["options"] for w in variants.values()) != 1:
            return None  # two variants with the same options could not be told apart
        return v["item_id"], {k: x for k, x in v["options"].items() if item["options"][k] != x}


def _new_address(rng: random.Random, old: dict) -> dict:
    city, state, zip_ = rng.choice(CITIES)
    a = {"address1": f"{rng.randint(1, 999)} {rng.choice(STREETS)}", "address2": f"Apt {rng.randint(1, 99)}",
         "city": city, "state": state, "country": "USA", "zip": zip_}
    return a if a["address1"] != old["address1"] else _new_address(rng, old)


# ---------------------------------------------------------------------------------------------------------------
# Planning one task: entities -> spec. Returns None when the drawn entities cannot carry the kind.


def _plan(rng: random.Random, shop: _Shop, kind: str, users: list[str]) -> dict | None:
    uid = rng.choice(users)
    user = shop.users[uid]
    orders = [shop.orders[o] for o in user["orders"] if o in shop.orders]
    offers = rng.choice(["email", "name_zip"])
    spec = {
        "world": "synthetic", "kind": kind, "goal": "act", "request": kind, "refuse_why": None,
        "user": {"user_id": uid, "first_name": user["name"]["first_name"], "last_name": user["name"]["last_name"],
                 "zip": user["address"]["zip"], "email": user["email"]},
        "offers": offers, "knows_email": offers == "email" or rng.random() < 0.5,
        "order_id": None, "order_known": True, "order_hint": None, "status": None,
        "items": [], "reason": None, "address": None, "payment": None, "question": None, "answer": None,
        "action": None, "max_user_turns": MAX_USER_TURNS,
    }
    pays = _pay_descriptions(user)
    if kind == "refuse":
        return _plan_refusal(rng, shop, spec, user, orders, users)
    if kind == "user_address":
        spec["address"] = _new_address(rng, user["address"])
        spec["action"] = {"name": WRITE_OF[kind], "arguments": {"user_id": uid, **spec["address"]}}
        return spec
    want = {"cancel": "pending", "modify_address": "pending", "modify_items": "pending", "modify_payment": "pending",
            "return": "delivered", "exchange": "delivered", "info": None}[kind]
    cands = [o for o in orders if want is None or o["status"] == want]
    if not cands:
        return None
    order = rng.choice(cands)
    oid = order["order_id"]
    spec.update(order_id=oid, status=order["status"])
    unknown = kind != "info" and rng.random() < 0.3  # the customer names a product instead of the order id
    args: dict = {"order_id": oid}
    if kind == "info":
        q = rng.choice(["status", "paid", "tracking"])
        if q == "tracking" and not order["fulfillments"]:
            q = "status"
        answer = {"status": order["status"], "paid": str(order["payment_history"][0]["amount"]),
                  "tracking": order["fulfillments"][0]["tracking_id"][0] if order["fulfillments"] else None}[q]
        spec.update(goal="answer", request=q, question=q, answer=answer)
        return spec
    if kind == "cancel":
        spec["reason"] = args["reason"] = rng.choice(retail.CANCEL_REASONS)
    elif kind == "modify_address":
        spec["address"] = _new_address(rng, order["address"])
        args.update(spec["address"])
    elif kind == "modify_payment":
        ph = order["payment_history"]
        if len(ph) != 1 or ph[0]["transaction_type"] != "payment":
            return None
        ok = [p for p in pays if p != ph[0]["payment_method_id"] and
              (user["payment_methods"][p]["source"] != "gift_card" or user["payment_methods"][p]["balance"] >= ph[0]["amount"])]
        if not ok:
            return None
        p = rng.choice(ok)
        spec["payment"] = {"id": p, "desc": pays[p]}
        args["payment_method_id"] = p
    elif kind == "return":
        items = shop.unique_names(order)
        if not items:
            return None
        chosen = rng.sample(items, rng.randint(1, min(2, len(items))))
        spec["items"] = [{"name": i["name"], "item_id": i["item_id"], "product_id": i["product_id"]} for i in chosen]
        orig = order["payment_history"][0]["payment_method_id"]
        gift = [p for p, d in pays.items() if d == "my gift card" and p != orig]
        p = rng.choice(gift) if gift and rng.random() < 0.4 else orig
        spec["payment"] = {"id": p, "desc": pays[p] if p != orig else "the original payment method"}
        args.update(item_ids=[i["item_id"] for i in chosen], payment_method_id=p)
    elif kind in ("modify_items", "exchange"):
        items = shop.unique_names(order)
        rng.shuffle(items)
        chosen = []
        for i in items[: rng.randint(1, 2)]:
            alt = shop.alternative(rng, i)
            if alt:
                chosen.append({"name": i["name"], "item_id": i["item_id"], "product_id": i["product_id"],
                               "new_item_id": alt[0], "change": alt[1], "price": i["price"]})
        if not chosen:
            return None
        diff = round(sum(shop.products[c["product_id"]]["variants"][c["new_item_id"]]["price"] - c["price"] for c in chosen), 2)
        ok = [p for p in pays if user["payment_methods"][p]["source"] != "gift_card" or user["payment_methods"][p]["balance"] >= diff]
        if not ok:
            return None
        p = rng.choice(ok)
        spec["items"] = [{k: c[k] for k in ("name", "item_id", "product_id", "new_item_id", "change")} for c in chosen]
        spec["payment"] = {"id": p, "desc": pays[p]}
        args.update(item_ids=[c["item_id"] for c in chosen], new_item_ids=[c["new_item_id"] for c in chosen],
                    payment_method_id=p)
    if unknown:  # an item the customer talks about anyway is the natural hint; else any product unique to the order
        names = [i["name"] for i in spec["items"]]
        hint = next((n for n in names if shop.hint(user, order, n)), None) or shop.hint(user, order)
        if hint:
            spec.update(order_known=False, order_hint=hint)
    spec["action"] = {"name": WRITE_OF[kind], "arguments": args}
    return spec


def _plan_refusal(rng, shop, spec, user, orders, users) -> dict | None:
    """A request the policy forbids. The customer asks as if it were fine; the expert looks and says no."""
    why = rng.choice(["status", "status", "other_user"])
    if why == "status":
        req = rng.choice(["cancel", "modify_address", "modify_payment", "return"])
        bad = {"return": ("pending", "processed")}.get(req, ("processed", "delivered", "pending (item modified)"))
        cands = [o for o in orders if o["status"] in bad]
    else:
        req = rng.choice(["cancel", "modify_address"])
        cands = [o for u in users if u != spec["user"]["user_id"] for o in
                 (shop.orders[x] for x in shop.users[u]["orders"] if x in shop.orders) if o["status"] == "pending"]
    if not cands:
        return None
    order = rng.choice(cands)
    spec.update(goal="refuse", request=req, refuse_why=why, order_id=order["order_id"], status=order["status"])
    args: dict = {"order_id": order["order_id"]}
    if req == "cancel":
        spec["reason"] = args["reason"] = rng.choice(retail.CANCEL_REASONS)
    elif req == "modify_address":
        spec["address"] = _new_address(rng, order["address"])
        args.update(spec["address"])
    elif req == "modify_payment":
        pays = _pay_descriptions(user)
        ok = [p for p in pays if p != order["payment_history"][0]["payment_method_id"]]
        if not ok:
            return None
        p = rng.choice(ok)
        spec["payment"] = {"id": p, "desc": pays[p]}
        args["payment_method_id"] = p
    else:  # return
        items = shop.unique_names(order)
        if not items:
            return None
        i = rng.choice(items)
        spec["items"] = [{"name": i["name"], "item_id": i["item_id"], "product_id": i["product_id"]}]
        p = order["payment_history"][0]["payment_method_id"]
        spec["payment"] = {"id": p, "desc": "the original payment method"}
        args.update(item_ids=[i["item_id"]], payment_method_id=p)
    spec["action"] = {"name": WRITE_OF[req], "arguments": args}
    return spec


def _add_confirm_check(spec: dict, shop: _Shop) -> None:
    """What a confirmation must say for the customer to answer "yes": the verb, every id, nothing confusable."""
    if spec["action"] is None:
        spec["confirm"] = None
        return
    must = [[spec["order_id"]]] if spec["order_id"] else []
    must += [[i["item_id"]] for i in spec["items"]] + [[i["new_item_id"]] for i in spec["items"] if "new_item_id" in i]
    if spec["reason"]:
        must.append([spec["reason"]])
    if spec["address"]:
        must += [[spec["address"]["address1"]], [spec["address"]["city"]], [spec["address"]["zip"]]]
    if spec["payment"]:
        must.append([spec["payment"]["id"], _pay_key(spec["payment"]["desc"])])
    wrong: set[str] = set()  # item ids a careless agent could mix up with the right ones
    if spec["order_id"]:
        order = shop.orders[spec["order_id"]]
        wrong |= {i["item_id"] for i in order["items"]}
        for i in spec["items"]:
            wrong |= set(shop.products[i["product_id"]]["variants"])
    wrong -= {x for group in must for x in group}
    spec["confirm"] = {"verbs": VERBS[spec["request"]], "must": must, "wrong": sorted(wrong)}


# ---------------------------------------------------------------------------------------------------------------
# What the customer says. Rendered from the spec only, so any agent meets the same customer.


def _order_phrase(spec: dict) -> str:
    if spec["order_known"]:
        return f"order {spec['order_id']}"
    if spec["order_hint"] in [i["name"] for i in spec["items"]]:
        return "order"  # "return the Lamp from my order": the item already says which order
    return f"order with the {spec['order_hint']}"


def _items_phrase(spec: dict, verb: str) -> str:
    if spec["request"] == "return":
        return " and ".join(f"the {i['name']}" for i in spec["items"])
    return " and ".join(f"the {i['name']} {verb} one with {_change_text(i['change'])}" for i in spec["items"])


def scripted_first_message(spec: dict) -> str:
    """The customer's opening request (fixed per task, as in MUA-RL: all G rollouts start the same way)."""
    r, op = spec["request"], _order_phrase(spec)
    return {
        "cancel": lambda: f"Hi, I want to cancel my {op}.",
        "modify_address": lambda: f"Hi, I want to change the shipping address of my {op}.",
        "modify_payment": lambda: f"Hi, I want to change the payment method of my {op} to {spec['payment']['desc']}.",
        "modify_items": lambda: f"Hi, I want to change {_items_phrase(spec, 'to')} in my pending {op}.",
        "return": lambda: f"Hi, I want to return {_items_phrase(spec, '')} from my {op}.",
        "exchange": lambda: f"Hi, I want to exchange {_items_phrase(spec, 'for')} from my {op}.",
        "user_address": lambda: "Hi, I want to change my default address.",
        "status": lambda: f"Hi, what is the status of my {op}?",
        "paid": lambda: f"Hi, how much did I pay for my {op}?",
        "tracking": lambda: f"Hi, what is the tracking number of my {op}?",
    }[r]()


def _identity(spec: dict, asks_email: bool, asks_name: bool) -> str:
    u = spec["user"]
    name_zip = f"I'm {u['first_name']} {u['last_name']}, zip code {u['zip']}."
    if asks_email and not asks_name:
        return f"My email is {u['email']}." if spec["knows_email"] else "I don't remember my email. " + name_zip
    if asks_name and not asks_email:
        return name_zip
    return f"My email is {u['email']}." if spec["offers"] == "email" else name_zip


def _confirmation_ok(spec: dict, text: str) -> bool:
    c = spec.get("confirm")
    if not c or not any(v in text for v in c["verbs"]):
        return False
    if not all(any(_mentions(text, alt) for alt in group) for group in c["must"]):
        return False
    if any(o != (spec["order_id"] or "").lower() for o in re.findall(r"#w\d+", text)):
        return False  # another order
    pay = spec["payment"]["id"] if spec["payment"] else None
    if any(p != pay for p in re.findall(r"(?:gift_card|credit_card|paypal)_\d+", text)):
        return False  # another payment method
    return not any(_mentions(text, w) for w in c["wrong"])


REFUSAL = re.compile(r"\bcannot\b|can't|can not|\bunable\b|not able|not possible|not allowed|not permitted")
DONE = re.compile(r"\bdone\b|successful|has been|have been|\bis now\b|\bare now\b|\bupdated\b|\bcompleted?\b")
CONFIRMING = re.compile(r"\byes\b|\bproceed\b")
IDENTITY = re.compile(r"e-?mail|zip|\bname\b|identity|verify|authenticat")


def scripted_reply(spec: dict, history: list[dict]) -> str:
    """The customer's next message, given the agent-side text conversation (tool traffic excluded).

    Rules, first match wins: stop at the turn bound or when the agent goes in circles; stop once the goal is
    reached (answer said / request refused / action reported done); answer a confirmation with "yes" only if
    it matches the request; identify (email or name + zip, whichever is asked); push back once on a refusal of
    an allowed request; reveal a fact the agent asks for; otherwise repeat the request.
    """
    mine = [m["content"] for m in history if m["role"] == "user"]
    agent = [(m.get("content") or "").strip() for m in history if m["role"] == "assistant"]
    if len(mine) + 1 >= spec["max_user_turns"] or not agent:
        return STOP  # this reply would be the last one the bound allows
    t = agent[-1].lower()
    if agent.count(agent[-1]) >= 3:
        return STOP  # the agent repeats itself: a conversation in circles
    goal = spec["goal"]
    if goal == "answer" and _norm(spec["answer"]) in _norm(t):
        return STOP
    if goal == "refuse" and REFUSAL.search(t):
        return STOP
    if "transfer" in t and "human" in t:
        return STOP
    reply = _reply_to(spec, t, mine)
    if len(mine) >= 2 and mine[-1] == mine[-2] == reply:
        return STOP  # third identical reply: we are going in circles
    return reply


def _reply_to(spec: dict, t: str, mine: list[str]) -> str:
    no = "No, that is not what I want. " + scripted_first_message(spec)
    ident = IDENTITY.search(t)
    if CONFIRMING.search(t) or ("confirm" in t and not ident):
        return YES if _confirmation_ok(spec, t) else no
    if spec["goal"] != "answer" and DONE.search(t):
        return STOP  # the agent reports the action done (for a forbidden request: the customer believes it)
    if ident:
        return _identity(spec, "mail" in t, "name" in t or "zip" in t)
    if REFUSAL.search(t):  # an allowed request refused: insist once, then give up
        return STOP if any(m.startswith("Please check again") for m in mine) else "Please check again; I think it is allowed."
    if "reason" in t and spec["reason"]:
        return f"The reason is {spec['reason']}."
    if "address" in t and spec["address"]:
        return f"The new address is {_addr_text(spec['address'])}."
    if re.search(r"payment|refund|pay\b|card|paypal", t) and spec["payment"]:
        return f"Please use {spec['payment']['desc']}."
    if re.search(r"order id|order number|which order", t) and spec["order_id"]:
        return (f"The order id is {spec['order_id']}." if spec["order_known"]
                else f"I don't know the order id; it is my order with the {spec['order_hint']}.")
    return scripted_first_message(spec)


def render_instructions(spec: dict) -> str:
    """The spec as the text an LLM user simulator would read (tau2's section layout)."""
    u, first = spec["user"], scripted_first_message(spec)
    goal = {"act": "You want this done.", "refuse": "You want this done.",
            "answer": "You want to know the answer."}[spec["goal"]]
    known = f"You are {u['first_name']} {u['last_name']}, zip code {u['zip']}."
    known += f" Your email is {u['email']}." if spec["knows_email"] else " You do not remember your email."
    if not spec["order_known"]:
        known += f" You do not know the order id; it is your order with the {spec['order_hint']}."
    reveal = []
    if spec["reason"]:
        reveal.append(f"The reason for cancelling: {spec['reason']}.")
    if spec["address"]:
        reveal.append(f"The new address: {_addr_text(spec['address'])}.")
    if spec["payment"] and spec["request"] != "modify_payment":
        reveal.append(f"The payment method to use: {spec['payment']['desc']}.")
    how = ("When asked to identify yourself, give your email." if spec["offers"] == "email"
           else "When asked to identify yourself, give your name and zip code.")
    if spec["action"]:
        how += (" Say 'yes' only to a confirmation that matches your request exactly (for checking only, do not say"
                f" these ids: {spec['action']['name']} {json.dumps(spec['action']['arguments'])});"
                " otherwise say no and repeat your request.")
    how += {"act": " When the agent says it is done, end the conversation with ###STOP###.",
            "refuse": " If the agent says it cannot do it, end the conversation with ###STOP###.",
            "answer": " When the agent tells you the answer, end the conversation with ###STOP###."}[spec["goal"]]
    parts = [f"Reason for call:\nYou open with: \"{first}\" {goal}", f"Known info:\n{known}"]
    if reveal:
        parts.append("Give only when asked:\n" + " ".join(reveal))
    parts.append(f"Task instructions:\n{how}")
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# The expert: the policy followed to the letter, as a script of ("say", text) and ("call", tool, arguments).


def _details(spec: dict) -> str:
    a, r = spec["action"]["arguments"], spec["request"]
    oid, pm = spec["order_id"], a.get("payment_method_id")
    swaps = ", ".join(f"item {x} -> {y}" for x, y in zip(a.get("item_ids", []), a.get("new_item_ids", [])))
    return {
        "cancel": lambda: f"cancel order {oid} (reason: {a.get('reason')})",
        "modify_address": lambda: f"ship order {oid} to {_addr_text(a)}",
        "modify_payment": lambda: f"pay order {oid} with {pm}",
        "modify_items": lambda: f"modify order {oid}: {swaps}; price difference via {pm}; that is all the items",
        "return": lambda: f"return item {', '.join(a.get('item_ids', []))} of order {oid}; refund to {pm}",
        "exchange": lambda: f"exchange order {oid}: {swaps}; price difference via {pm}; that is all the items",
        "user_address": lambda: f"set your default address to {_addr_text(a)}",
    }[r]()


def _done(spec: dict) -> str:
    oid, pm = spec["order_id"], (spec["payment"] or {}).get("id")
    return {
        "cancel": f"Done. Order {oid} is cancelled.",
        "modify_address": f"Done. Order {oid} will ship to the new address.",
        "modify_payment": f"Done. Order {oid} is now paid with {pm}.",
        "modify_items": f"Done. The items of order {oid} are modified.",
        "return": f"Done. The return of order {oid} is requested; you will get an email with instructions.",
        "exchange": f"Done. The exchange of order {oid} is requested; you will get an email with instructions.",
        "user_address": "Done. Your default address is updated.",
    }[spec["request"]]


def _final_word(spec: dict) -> str:
    oid = spec["order_id"]
    if spec["goal"] == "answer":
        return {"status": f"Order {oid} is {spec['answer']}.", "paid": f"You paid {spec['answer']} for order {oid}.",
                "tracking": f"The tracking number of order {oid} is {spec['answer']}."}[spec["question"]]
    if spec["refuse_why"] == "other_user":
        return f"Sorry, order {oid} is not in your account, so I cannot change it."
    return f"Sorry, order {oid} is {spec['status']}, so it cannot be {PAST[spec['request']]}."


def _expert_script(spec: dict, shop: _Shop) -> list[tuple]:
    u, req, goal = spec["user"], spec["request"], spec["goal"]
    steps: list[tuple] = [("say", ASK_ID)]
    if spec["offers"] == "email":
        steps.append(("call", "find_user_id_by_email", {"email": u["email"]}))
    else:
        steps.append(("call", "find_user_id_by_name_zip",
                      {"first_name": u["first_name"], "last_name": u["last_name"], "zip": u["zip"]}))
    # the profile holds the payment methods and the order list: fetched when one of them is needed
    if not spec["order_known"] or (goal == "act" and req in ("modify_payment", "modify_items", "return", "exchange")):
        steps.append(("call", "get_user_details", {"user_id": u["user_id"]}))
    if spec["order_id"]:
        todo = [spec["order_id"]]
        if not spec["order_known"]:  # open the user's orders in turn until the one with the named product
            orders = shop.users[u["user_id"]]["orders"]
            todo = orders[: orders.index(spec["order_id"]) + 1]
        steps += [("call", "get_order_details", {"order_id": o}) for o in todo]
    if goal != "act":
        return steps + [("say", _final_word(spec))]
    for pid in dict.fromkeys(i["product_id"] for i in spec["items"] if "new_item_id" in i):  # variants to pick from
        steps.append(("call", "get_product_details", {"product_id": pid}))
    ask = {"cancel": ASK_REASON, "modify_address": ASK_ADDRESS, "user_address": ASK_ADDRESS, "return": ASK_REFUND,
           "exchange": ASK_DIFF, "modify_items": ASK_DIFF}.get(req)
    if ask:
        steps.append(("say", ask))
    steps.append(("say", CONFIRM.format(_details(spec))))
    steps.append(("call", spec["action"]["name"], spec["action"]["arguments"]))
    return steps + [("say", _done(spec))]


def text_view(messages: list[dict]) -> list[dict]:
    """What a customer sees of a conversation: user messages and assistant text, no tool traffic."""
    return [{"role": m["role"], "content": m["content"]} for m in messages
            if m["role"] == "user" or (m["role"] == "assistant" and not m.get("tool_calls") and m.get("content"))]


def _play(world: World, spec: dict, steps: list[tuple]) -> tuple[list[dict], list[dict]]:
    """Run the script on a fresh env against the scripted customer; check the conversation went as planned."""
    env = world.new_env()
    msgs = [{"role": "user", "content": scripted_first_message(spec)}]
    actions = []
    try:
        for step in steps:
            if step[0] == "call":
                _, name, args = step
                if name in world.write_tools and msgs[-1]["content"] != YES:
                    raise AssertionError(f"write {name} without a 'yes' (user said {msgs[-1]['content']!r})")
                out = env.call(name, json.loads(json.dumps(args)))
                if env.calls[-1].error:
                    raise AssertionError(f"{name}({args}) failed: {out}")
                msgs.append({"role": "assistant", "content": "",
                             "tool_calls": [{"type": "function", "function": {"name": name, "arguments": args}}]})
                msgs.append({"role": "tool", "name": name, "content": out})
                actions.append({"name": name, "arguments": args})
            else:
                if msgs[-1]["role"] == "user" and msgs[-1]["content"] == STOP:
                    raise AssertionError(f"the customer stopped before: {step[1]!r}")
                msgs.append({"role": "assistant", "content": step[1]})
                msgs.append({"role": "user", "content": scripted_reply(spec, text_view(msgs))})
        if msgs[-1]["content"] != STOP:
            raise AssertionError(f"the customer did not stop: {msgs[-1]['content']!r}")
        wrote = any(env.db.written(c) for c in world.collections)
        if wrote != (spec["goal"] == "act"):
            raise AssertionError(f"goal {spec['goal']} but database {'changed' if wrote else 'unchanged'}")
    finally:
        env.close()
    return msgs, actions


# ---------------------------------------------------------------------------------------------------------------
# Generation, and keeping away from protected tasks (tau2's test split; the small world's held-out tasks)


def write_keys(world: World, task: Task) -> set[tuple[str, str]]:
    """The kind-defining part of a task: (write tool, the order or user it changes) for each gold write."""
    return {(a["name"], a["arguments"].get("order_id") or a["arguments"].get("user_id"))
            for a in task.actions if a["name"] in world.write_tools}


def task_user_ids(world: World, task: Task) -> set[str]:
    """Every user a task's gold actions touch: found by lookup, named, or owning a named order."""
    env, users = world.new_env(), set()
    for a in task.actions:
        args = a.get("arguments") or {}
        out = env.call(a["name"], json.loads(json.dumps(args)))
        if a["name"].startswith("find_user_id") and not env.calls[-1].error:
            users.add(out)
        if isinstance(args.get("user_id"), str):
            users.add(args["user_id"])
        if (o := env.db.get("orders", args.get("order_id"))) is not None:
            users.add(o["user_id"])
    env.close()
    return users


def generate_tasks(world: World, n: int, seed: int, kinds=None, users=None, avoid=None, prefix=None) -> list[Task]:
    """`n` tasks drawn with `seed` (same arguments -> same tasks), each played once by the expert.

    kinds: subset of KINDS (default all, mixed by KIND_WEIGHTS). users: the user ids tasks may involve (default
    all). avoid: tasks to stay clear of (default the world's "test" split): no generated task involves one of
    their users or repeats one of their (write tool, target) pairs.
    """
    kinds = list(kinds or KINDS)
    if bad := [k for k in kinds if k not in KINDS]:
        raise ValueError(f"unknown kinds {bad}; choose from {KINDS}")
    shop = _Shop(world)
    avoid = world.tasks("test") if avoid is None else avoid
    banned_users = set().union(*(task_user_ids(world, t) for t in avoid)) if avoid else set()
    banned_keys = set().union(*(write_keys(world, t) for t in avoid)) if avoid else set()
    pool = [u for u in (users if users is not None else shop.users) if u not in banned_users]
    rng, prefix = random.Random(seed), prefix or f"synth-{world.name}"
    tasks, seen, tries = [], set(), 0
    while len(tasks) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise RuntimeError(f"made only {len(tasks)} of {n} distinct tasks from {len(pool)} users; ask for fewer")
        # Draw the kind first, then retry entities for that kind: the mix follows KIND_WEIGHTS even when some
        # kinds rarely fit a random user (a payment change needs a second usable payment method).
        kind = rng.choices(kinds, weights=[KIND_WEIGHTS[k] for k in kinds])[0]
        spec = next((s for s in (_plan(rng, shop, kind, pool) for _ in range(20)) if s is not None), None)
        if spec is None or (key := json.dumps(spec, sort_keys=True)) in seen:
            continue
        _add_confirm_check(spec, shop)
        expert, actions = _play(world, spec, _expert_script(spec, shop))
        # The id carries a digest of the spec: World caches gold databases by task id, so two different tasks
        # must never share one (e.g. the same seed drawn with different `kinds`).
        digest = content_key(key)[:6]
        task = Task(id=f"{prefix}/s{seed}-{len(tasks)}-{digest}", domain=world.name, split="synthetic",
                    instructions=render_instructions(spec), actions=actions,
                    outputs=[spec["answer"]] if spec["goal"] == "answer" else [], spec=spec, expert=expert)
        if write_keys(world, task) & banned_keys:
            continue
        seen.add(key)
        tasks.append(task)
    return tasks


def replay_expert(world: World, task: Task, skip_last_write: bool = False):
    """A fresh env after the expert's tool calls (optionally without its last write): what score() judges."""
    calls = [tc["function"] for m in task.expert if m["role"] == "assistant" for tc in m.get("tool_calls") or []]
    writes = [i for i, c in enumerate(calls) if c["name"] in world.write_tools]
    env = world.new_env()
    for i, c in enumerate(calls):
        if not (skip_last_write and writes and i == writes[-1]):
            env.call(c["name"], json.loads(json.dumps(c["arguments"])))
    return env


# ---------------------------------------------------------------------------------------------------------------
# A small synthetic shop for the CPU demo: same tools and record shapes as retail, far fewer and shorter records.

FIRST = ["Ava", "Ben", "Cleo", "Dan", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jade", "Kai", "Lena", "Max", "Nora",
         "Omar", "Pia", "Raj", "Sara", "Tom", "Uma", "Vic", "Wen", "Yara", "Zane"]
LAST = ["Li", "Kim", "Diaz", "Ito", "Cole", "Nash", "Park", "Ruiz", "Shaw", "Wong", "Fox", "Gray"]
CITIES = [("Austin", "TX", "78701"), ("Boston", "MA", "02108"), ("Denver", "CO", "80202"), ("Miami", "FL", "33101"),
          ("Reno", "NV", "89501"), ("Salem", "OR", "97301"), ("Tulsa", "OK", "74103"), ("Omaha", "NE", "68102")]
STREETS = ["Oak St", "Pine Ave", "Elm St", "Lake Rd", "Hill Dr", "Main St", "Park Ave", "River Rd"]
PRODUCTS = [  # name, base price, options (every combination is a variant)
    ("Lamp", 40, {"color": ["black", "white"], "size": ["small", "large"]}),
    ("Mug", 12, {"color": ["red", "blue", "green"], "size": ["small", "large"]}),
    ("T-Shirt", 25, {"color": ["red", "blue"], "size": ["S", "M", "L"]}),
    ("Backpack", 60, {"color": ["black", "grey"], "volume": ["20L", "30L"]}),
    ("Kettle", 35, {"color": ["silver", "black"], "capacity": ["1L", "2L"]}),
    ("Headphones", 90, {"type": ["wired", "wireless"], "color": ["black", "white"]}),
    ("Sneakers", 80, {"size": ["8", "9", "10"], "color": ["white", "black"]}),
    ("Watch", 150, {"band": ["leather", "metal"], "color": ["gold", "silver"]}),
]
STATUSES = (["pending"] * 7 + ["delivered"] * 7 + ["processed"] * 3 + ["cancelled"] * 2 + ["pending (item modified)"])
SYNTH_VERSION = "synthetic-1"  # bump when the generator below changes what a seed produces

SHORT_POLICY = """You are a retail customer service agent. You can cancel or modify pending orders, return or \
exchange delivered orders, change a user's default address, and answer questions about the user's own orders.
- First authenticate the user: find their user id by email, or by first name, last name and zip code.
- Help only the authenticated user: refuse any request about another user's order.
- Only orders with status 'pending' can be cancelled or modified; only 'delivered' orders can be returned or \
exchanged. Politely refuse anything else.
- A cancellation reason is 'no longer needed' or 'ordered by mistake'. A new item must be an available variant of \
the same product. A refund goes to the original payment method or a gift card.
- Before any change, list the details and ask for explicit confirmation (yes). Act only after the user says yes.
- Make at most one tool call at a time, and do not talk to the user in the same message."""

_ORDER = "order_id: The order id, such as '#W1234'."
_ADDR = ("address1: Street line.\n    address2: Second line.\n    city: City.\n    state: State.\n"
         "    country: Country.\n    zip: Zip code.")
_SWAP = ("item_ids: The item ids to change.\n    new_item_ids: The new item ids, same order.\n"
         "    payment_method_id: Pays or receives the price difference.")
SHORT_DOCS = {  # one-line tool descriptions: the system prompt of a tiny model must stay short
    "find_user_id_by_email": "Find a user id by email.\n\nArgs:\n    email: The email.",
    "find_user_id_by_name_zip": "Find a user id by name and zip code.\n\nArgs:\n    first_name: First name.\n"
                                "    last_name: Last name.\n    zip: Zip code.",
    "get_user_details": "Get a user's address, payment methods and order ids.\n\nArgs:\n    user_id: The user id.",
    "get_order_details": f"Get an order's status, items and payments.\n\nArgs:\n    {_ORDER}",
    "get_product_details": "Get a product's variants (item ids, options, availability, price).\n\nArgs:\n"
                           "    product_id: The product id (not an item id).",
    "cancel_pending_order": f"Cancel a pending order.\n\nArgs:\n    {_ORDER}\n"
                            "    reason: 'no longer needed' or 'ordered by mistake'.",
    "modify_pending_order_address": f"Change the shipping address of a pending order.\n\nArgs:\n    {_ORDER}\n    {_ADDR}",
    "modify_pending_order_items": f"Change items of a pending order to other variants.\n\nArgs:\n    {_ORDER}\n    {_SWAP}",
    "modify_pending_order_payment": f"Pay a pending order with another payment method.\n\nArgs:\n    {_ORDER}\n"
                                    "    payment_method_id: The new payment method id.",
    "modify_user_address": f"Change a user's default address.\n\nArgs:\n    user_id: The user id.\n    {_ADDR}",
    "return_delivered_order_items": f"Return items of a delivered order.\n\nArgs:\n    {_ORDER}\n"
                                    "    item_ids: The item ids to return.\n    payment_method_id: Receives the refund.",
    "exchange_delivered_order_items": f"Exchange items of a delivered order for other variants.\n\nArgs:\n    {_ORDER}\n    {_SWAP}",
}


def _short_tool(fn, doc: str):
    # Same name, signature and behaviour as retail's tool; only the docstring (hence the schema text) is shorter.
    @functools.wraps(fn)
    def tool(db, **arguments):
        return fn(db, **arguments)

    tool.__doc__ = doc
    return tool


def _unique(rng: random.Random, used: set, make) -> str:
    while (x := make()) in used:
        pass
    used.add(x)
    return x


def build_db(seed: int = 0, n_users: int = 40, n_products: int = 8) -> dict:
    """A tau2-shaped raw retail database (products, users, orders), every id short, drawn from `seed`."""
    rng, used = random.Random(seed), set()
    digits = lambda k: lambda: "".join(rng.choice("0123456789") for _ in range(k))  # noqa: E731
    products = {}
    for name, base, options in PRODUCTS[:n_products]:
        pid = _unique(rng, used, digits(3))
        combos = [{}]
        for k, vals in options.items():
            combos = [{**c, k: v} for c in combos for v in vals]
        variants = {}
        for opts in combos:
            iid = _unique(rng, used, digits(4))
            variants[iid] = {"item_id": iid, "options": opts, "available": rng.random() < 0.85,
                             "price": round(base * rng.uniform(0.85, 1.15), 2)}
        products[pid] = {"name": name, "product_id": pid, "variants": variants}
    names = [(f, l) for f in FIRST for l in LAST]  # (first, last) unique: find-by-name+zip must find one user
    rng.shuffle(names)
    users, orders = {}, {}
    for first, last in names[:n_users]:
        uid = f"{first}_{last}_{digits(2)()}".lower()
        city, state, zip_ = rng.choice(CITIES)
        address = {"address1": f"{rng.randint(1, 999)} {rng.choice(STREETS)}", "address2": f"Apt {rng.randint(1, 99)}",
                   "city": city, "country": "USA", "state": state, "zip": zip_}
        methods = {}
        for source in ("credit_card", "paypal", "gift_card"):
            if rng.random() < {"credit_card": 0.7, "paypal": 0.4, "gift_card": 0.5}[source] or (source == "gift_card" and not methods):
                mid = _unique(rng, used, lambda s=source: f"{s}_{digits(4)()}")
                methods[mid] = {"source": source, "id": mid}
                if source == "credit_card":
                    methods[mid].update(brand=rng.choice(["visa", "mastercard"]), last_four=digits(4)())
                if source == "gift_card":
                    methods[mid]["balance"] = float(rng.randint(0, 300))
        user = {"user_id": uid, "name": {"first_name": first, "last_name": last}, "address": address,
                "email": f"{first}.{last}{digits(2)()}@example.com".lower(), "payment_methods": methods, "orders": []}
        for _ in range(rng.randint(1, 3)):
            oid = _unique(rng, used, lambda: f"#W{digits(4)()}")
            items = []
            for p in rng.sample(list(products.values()), rng.randint(1, 3)):
                v = rng.choice(list(p["variants"].values()))
                items.append({"name": p["name"], "product_id": p["product_id"], "item_id": v["item_id"],
                              "price": v["price"], "options": v["options"]})
            status, pay = rng.choice(STATUSES), rng.choice(list(methods))
            total = round(sum(i["price"] for i in items), 2)
            history = [{"transaction_type": "payment", "amount": total, "payment_method_id": pay}]
            if status == "cancelled":
                history.append({"transaction_type": "refund", "amount": total, "payment_method_id": pay})
            shipped = status in ("processed", "delivered")
            orders[oid] = {"order_id": oid, "user_id": uid, "address": dict(address), "items": items, "status": status,
                           "fulfillments": [{"tracking_id": [digits(6)()], "item_ids": [i["item_id"] for i in items]}] if shipped else [],
                           "payment_history": history}
            user["orders"].append(oid)
        users[uid] = user
    return {"products": products, "users": users, "orders": orders}


def build_world(seed: int = 0, n_users: int = 40, n_test_users: int = 10, n_products: int = 8, n_train: int = 500,
                n_test: int = 100, tool_set: str = "core") -> World:
    """The small synthetic retail world with its own tasks.

    Users are split in two: "test" tasks involve only the n_test_users held-out users, "train" tasks only the
    others (and never repeat a test task's write), so a held-out task is new people, orders and ids.
    tool_set "core": the 12 tools the tasks need, with one-line docstrings, and a short policy; "full": all of
    retail's tools with tau2's docstrings.
    """
    raw = build_db(seed, n_users, n_products)
    db = retail.normalise(raw)
    key = content_key(json.dumps(raw, sort_keys=True), retail.NORMALISER_VERSION, SYNTH_VERSION, tool_set)
    if tool_set == "core":
        by_name = {fn.__name__: fn for fn in retail.TOOLS}
        tools = [_short_tool(by_name[name], doc) for name, doc in SHORT_DOCS.items()]
    elif tool_set == "full":
        tools = list(retail.TOOLS)
    else:
        raise ValueError(f"tool_set must be 'core' or 'full', not {tool_set!r}")
    base = World("synthetic", db, key, tools, retail.WRITE_TOOLS, SHORT_POLICY)
    users = list(db["users"])
    random.Random(seed).shuffle(users)
    test = generate_tasks(base, n_test, seed=2 * seed + 1, users=users[:n_test_users], avoid=[], prefix="synthetic/test")
    train = generate_tasks(base, n_train, seed=2 * seed, users=users[n_test_users:], avoid=test, prefix="synthetic/train")
    for split, tasks in (("train", train), ("test", test)):
        for t in tasks:
            t.split = split
    return World("synthetic", db, key, tools, retail.WRITE_TOOLS, SHORT_POLICY, train + test)  # same template file


# ---------------------------------------------------------------------------------------------------------------
# Demo: python -m domains.synthetic [--world retail] [--kind exchange] [--stats]


def stats(world: World, tasks: list[Task]) -> dict:
    """Kind mix, expert length and tool output length of a set of tasks (for the README and the report)."""
    from collections import Counter

    kinds = Counter(t.spec["kind"] + ("" if t.spec["goal"] != "refuse" else f"/{t.spec['refuse_why']}") for t in tasks)
    msgs = [len(t.expert) for t in tasks]
    user_turns = [sum(m["role"] == "user" for m in t.expert) for t in tasks]
    calls = [sum(m["role"] == "tool" for m in t.expert) for t in tasks]
    outs = sorted(len(m["content"]) for t in tasks for m in t.expert if m["role"] == "tool")
    chars = [sum(len(m.get("content") or "") + len(json.dumps(m.get("tool_calls") or "")) for m in t.expert) for t in tasks]
    mean = lambda xs: round(sum(xs) / len(xs), 1)  # noqa: E731
    return {"tasks": len(tasks), "kinds": dict(sorted(kinds.items())), "messages_mean": mean(msgs), "messages_max": max(msgs),
            "user_turns_mean": mean(user_turns), "tool_calls_mean": mean(calls), "tool_calls_max": max(calls),
            "tool_output_chars_mean": mean(outs), "tool_output_chars_p50": outs[len(outs) // 2],
            "tool_output_chars_max": outs[-1], "conversation_chars_mean": mean(chars)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Generate a synthetic task and show its spec, instructions and expert.")
    ap.add_argument("--world", default="synthetic", choices=["synthetic", "retail"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kind", default="exchange", choices=KINDS)
    ap.add_argument("--stats", action="store_true", help="print statistics of 200 generated tasks instead")
    args = ap.parse_args()
    if args.world == "retail":
        world = retail.build_world()
    else:
        world = build_world(seed=0, n_train=20, n_test=10)
    if args.stats:
        print(json.dumps(stats(world, generate_tasks(world, 200, args.seed, avoid=[] if args.world == "synthetic" else None)), indent=2))
        raise SystemExit
    task = generate_tasks(world, 1, args.seed, kinds=[args.kind] if args.kind else None)[0]
    print(f"== {task.id}  kind={task.spec['kind']} goal={task.spec['goal']}\n\n== spec\n{json.dumps(task.spec, indent=1)}")
    print(f"\n== instructions\n{task.instructions}\n\n== expert conversation")
    for m in task.expert:
        if m.get("tool_calls"):
            f = m["tool_calls"][0]["function"]
            print(f"[agent] -> {f['name']}({json.dumps(f['arguments'])})")
        elif m["role"] == "tool":
            print(f"[tool ] {m['content'][:300]}{'...' if len(m['content']) > 300 else ''}")
        else:
            print(f"[{'agent' if m['role'] == 'assistant' else 'user '}] {m['content']}")
    env = replay_expert(world, task)
    reward, info = world.score(task, env, task.expert, check_outputs=True)
    print(f"\n== score of the expert: {reward}  ({json.dumps({k: info[k] for k in ('db_match', 'outputs_missing', 'calls', 'write_calls')})})")

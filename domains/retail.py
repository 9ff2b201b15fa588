"""The retail world: tau2-bench's online shop (500 users, 1,000 orders, 50 products) and its 16 tools.

MUA-RL trains and evaluates on tau2-bench's retail domain: a customer talks to the agent, the agent looks things
up and changes orders through tools, and the reward is 1 iff the final database equals the one the task's gold
actions produce. This file is that domain, re-written on base.py's SQLite document store:

    build_world(data_dir)   load db.json, normalise every record to tau2's model_dump() shape, build the template
    the tools               16 module-level functions with tau2's names, arguments, outputs and error texts,
                            plus `think` (generic, changes nothing)
    WRITE_TOOLS             the 7 tools that can change the database

Three collections, keyed as in db.json:
    products  product_id -> {name, product_id, variants: {item_id -> {item_id, options, available, price}}}
    users     user_id    -> {user_id, name, address, email, payment_methods: {id -> method}, orders: [order ids]}
    orders    order_id   -> {order_id, user_id, address, items, status, fulfillments, payment_history, + 7 fields
                             that exist only after a cancel / exchange / return and are null before}

Parity. tests/test_retail_parity.py replays 414 sequences recorded from tau2's own tools (2,494 calls) and checks
every output byte, every error flag and the final database. Tools therefore follow tau2's order of checks (the
first failing check decides the message), do their arithmetic in the same order with the same rounding, and keep
tau2's known quirks; each quirk is marked `QUIRK` where it happens.

Departures from tau2-bench (none change an output the fixtures pin):
1. A list argument (item_ids, new_item_ids) that is not a list is refused with a clear error. tau2 would iterate
   over whatever it got (a string's characters, say) before failing or, rarely, succeeding.
2. A non-string address field gets pydantic's message without its trailing "For further information" URL line.
3. Names and emails are compared lower-cased (SQLite's lower() on the stored side: all of db.json is ASCII, where
   it equals Python's str.lower()). tau2's newest code also strips accents; the recorded fixtures cannot tell.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from domains.base import Store, World, content_key
from domains.tau2_data import find_data, load_tasks
from tools import calculate, think, transfer_to_human_agents

# Bump when the normaliser changes what a template holds: the template cache key includes it.
NORMALISER_VERSION = "retail-2"

# ---------------------------------------------------------------------------------------------------------------
# Normalising db.json into tau2's record shape
#
# tau2 loads db.json into pydantic models and its tools answer with json.dumps(model.model_dump()). That dump
# lists fields in the model's declaration order and includes every optional field (as null). Our tools answer
# with json.dumps(stored_record), so the stored record must already be in that exact shape. Pydantic also turns
# an int into a float for float fields (price 50 -> 50.0), and since 1 and 1.0 hash differently we do the same.

ADDRESS_FIELDS = ("address1", "address2", "city", "country", "state", "zip")
PAYMENT_FIELDS = {  # tau2's three payment-method models, told apart by `source`
    "credit_card": ("source", "id", "brand", "last_four"),
    "paypal": ("source", "id"),
    "gift_card": ("source", "id", "balance"),
}
ORDER_EXTRA_FIELDS = (  # optional Order fields, absent from db.json, set by cancel / exchange / return
    "cancel_reason",
    "exchange_items",
    "exchange_new_items",
    "exchange_payment_method_id",
    "exchange_price_difference",
    "return_items",
    "return_payment_method_id",
)
CANCEL_REASONS = ("no longer needed", "ordered by mistake")


def _address(a: dict) -> dict:
    return {k: a[k] for k in ADDRESS_FIELDS}


def _payment_method(p: dict) -> dict:
    rec = {k: p[k] for k in PAYMENT_FIELDS[p["source"]]}
    if "balance" in rec:
        rec["balance"] = float(rec["balance"])
    return rec


def _product(p: dict) -> dict:
    variants = {
        vid: {"item_id": v["item_id"], "options": v["options"], "available": v["available"], "price": float(v["price"])}
        for vid, v in p["variants"].items()
    }
    return {"name": p["name"], "product_id": p["product_id"], "variants": variants}


def _user(u: dict) -> dict:
    return {
        "user_id": u["user_id"],
        "name": {"first_name": u["name"]["first_name"], "last_name": u["name"]["last_name"]},
        "address": _address(u["address"]),
        "email": u["email"],
        "payment_methods": {pid: _payment_method(p) for pid, p in u["payment_methods"].items()},
        "orders": list(u["orders"]),
    }


def _order(o: dict) -> dict:
    rec = {
        "order_id": o["order_id"],
        "user_id": o["user_id"],
        "address": _address(o["address"]),
        "items": [
            {"name": i["name"], "product_id": i["product_id"], "item_id": i["item_id"], "price": float(i["price"]),
             "options": i["options"]}
            for i in o["items"]
        ],
        "status": o["status"],
        "fulfillments": [{"tracking_id": f["tracking_id"], "item_ids": f["item_ids"]} for f in o["fulfillments"]],
        "payment_history": [_payment(p["transaction_type"], p["amount"], p["payment_method_id"]) for p in o["payment_history"]],
    }
    rec.update({k: o.get(k) for k in ORDER_EXTRA_FIELDS})  # null unless db.json already has them
    if rec["exchange_price_difference"] is not None:  # validated (int -> float) when tau2 loads db.json...
        rec["exchange_price_difference"] = float(rec["exchange_price_difference"])
    # ...but not when a tool assigns it later: an empty exchange stores the int 0 (see the exchange tool).
    return rec


def _payment(kind: str, amount: Any, method_id: str) -> dict:
    # A new OrderPayment is validated by pydantic, so its amount is a float even when computed as the int 0.
    return {"transaction_type": kind, "amount": float(amount), "payment_method_id": method_id}


def normalise(db: dict) -> dict[str, dict[str, dict]]:
    return {
        "products": {k: _product(v) for k, v in db["products"].items()},
        "users": {k: _user(v) for k, v in db["users"].items()},
        "orders": {k: _order(v) for k, v in db["orders"].items()},
    }


# ---------------------------------------------------------------------------------------------------------------
# Lookups shared by the tools. Each raises tau2's message when the thing is missing.


def _get(db: Store, coll: str, rid: Any, missing: str) -> dict:
    hash(rid)  # a list or dict id fails as in tau2's `rid in dict`: "unhashable type: 'list'"
    rec = db.get(coll, rid)
    if rec is None:
        raise ValueError(missing)
    return rec


def _order_rec(db: Store, order_id: Any) -> dict:
    return _get(db, "orders", order_id, "Order not found")


def _user_rec(db: Store, user_id: Any) -> dict:
    return _get(db, "users", user_id, "User not found")


def _method(user: dict, method_id: Any) -> dict:
    # Returns the method dict *inside* `user`, so changing a balance changes the user record we will put back.
    if method_id not in user["payment_methods"]:
        raise ValueError("Payment method not found")
    return user["payment_methods"][method_id]


def _is_gift_card(method: dict) -> bool:
    return method["source"] == "gift_card"


def _variant(db: Store, product_id: Any, item_id: Any) -> dict:
    product = _get(db, "products", product_id, "Product not found")
    if item_id not in product["variants"]:
        raise ValueError("Variant not found")
    return product["variants"][item_id]


def _id_list(value: Any, arg: str) -> list:
    if not isinstance(value, list):  # departure 1
        raise ValueError(f"{arg} must be a list of item ids, such as ['1008292230'], not {type(value).__name__}")
    return value


def _new_address(**fields: Any) -> dict:
    # tau2 builds a pydantic UserAddress, which rejects a non-string field; its message is imitated (departure 2).
    bad = [(k, v) for k, v in fields.items() if not isinstance(v, str)]
    if bad:
        n = len(bad)
        lines = [f"{n} validation error{'s' if n > 1 else ''} for UserAddress"]
        for k, v in bad:
            lines += [k, f"  Input should be a valid string [type=string_type, input_value={v!r}, input_type={type(v).__name__}]"]
        raise ValueError("\n".join(lines))
    return {k: fields[k] for k in ADDRESS_FIELDS}


# ---------------------------------------------------------------------------------------------------------------
# Read tools


def find_user_id_by_email(db: Store, email: str) -> str:
    """Look up a customer's user id from their email address (case does not matter).

    Prefer this way of identifying a customer; fall back to name and zip code only when the email is unknown.

    Args:
        email: The customer's email address, for example 'jane.roe1234@example.com'.
    """
    wanted = email.lower()  # a non-string fails here, with Python's own message, exactly as in tau2
    hits = db.query("users", "lower(json_extract(doc, '$.email')) = ?", (wanted,))
    if not hits:
        raise ValueError("User not found")
    return hits[0][0]  # the first user in db.json order, as tau2's loop returns


def find_user_id_by_name_zip(db: Store, first_name: str, last_name: str, zip: str) -> str:
    """Look up a customer's user id from their first name, last name and zip code (name case does not matter).

    Use this only when the customer cannot give an email address or the email finds nobody.

    Args:
        first_name: The customer's first name, for example 'Jane'.
        last_name: The customer's last name, for example 'Roe'.
        zip: The five-digit zip code of the customer's default address, for example '90210', as a string.
    """
    # tau2 tests, per user: first name, then last name, then zip. So a non-string first name always fails, a
    # non-string last name fails only once some first name matched, and a non-string zip simply never matches.
    candidates = db.query("users", "lower(json_extract(doc, '$.name.first_name')) = ?", (first_name.lower(),))
    for user_id, user in candidates:
        if user["name"]["last_name"].lower() == last_name.lower() and user["address"]["zip"] == zip:
            return user_id
    raise ValueError("User not found")


def get_user_details(db: Store, user_id: str) -> dict:
    """Show a customer's profile: name, default address, email, payment methods and the ids of their orders.

    Args:
        user_id: The user id, for example 'sara_doe_496'.
    """
    return _user_rec(db, user_id)


def get_order_details(db: Store, order_id: str) -> dict:
    """Show an order: its status, items with prices and options, shipping address, fulfillments and payments.

    Args:
        order_id: The order id. It starts with '#W' followed by digits, for example '#W0000000'; do not drop the '#'.
    """
    return _order_rec(db, order_id)


def get_product_details(db: Store, product_id: str) -> dict:
    """Show a product type and every item (variant) of it: options, price and whether it is available.

    Args:
        product_id: The product id, ten digits such as '6086499569'. A product id is not an item id.
    """
    return _get(db, "products", product_id, "Product not found")


def get_item_details(db: Store, item_id: str) -> dict:
    """Show one item (a specific variant of a product): its options, price and availability.

    Args:
        item_id: The item id, ten digits such as '1008292230'. An item id is not a product id.
    """
    if isinstance(item_id, str):  # anything else is in no product's variants, as in tau2's `in` test
        hits = db.query("products", "EXISTS (SELECT 1 FROM json_each(doc, '$.variants') WHERE key = ?)", (item_id,))
        if hits:
            return hits[0][1]["variants"][item_id]
    else:
        hash(item_id)
    raise ValueError("Item not found")


def list_all_product_types(db: Store) -> str:
    """List every product type the store sells (there are 50) as a JSON object from product name to product id.

    Each product type comes in several items (variants) with their own item ids and options.
    """
    names = {p["name"]: p["product_id"] for _, p in db.scan("products")}
    return json.dumps(names, sort_keys=True)  # tau2 serialises this one itself, with sorted keys


# ---------------------------------------------------------------------------------------------------------------
# Write tools. Each reads, checks in tau2's order, then writes; a message names the first check that failed.


def cancel_pending_order(db: Store, order_id: str, reason: str) -> dict:
    """Cancel an order that is still pending (not yet processed or delivered) and refund its payments.

    Explain what will be cancelled and get an explicit "yes" from the customer first. The order's status becomes
    'cancelled'. Money paid by gift card goes back to that gift card at once; other refunds take 5-7 business days.
    Returns the cancelled order.

    Args:
        order_id: The order id, such as '#W0000000' (with the leading '#').
        reason: Why the customer cancels: exactly 'no longer needed' or 'ordered by mistake'.
    """
    order = _order_rec(db, order_id)
    if order["status"] != "pending":  # exactly 'pending': a 'pending (item modified)' order cannot be cancelled
        raise ValueError("Non-pending order cannot be cancelled")
    if reason not in set(CANCEL_REASONS):
        raise ValueError("Invalid reason")
    # QUIRK: every row of the payment history is refunded, refund rows included, so an order whose payment method
    # was changed (payment, payment, refund) gets three refunds, and each gift-card row is credited back.
    refunds, user = [], None
    try:
        for p in order["payment_history"]:
            refunds.append(_payment("refund", p["amount"], p["payment_method_id"]))
            user = user or _user_rec(db, order["user_id"])
            method = _method(user, p["payment_method_id"])
            if _is_gift_card(method):
                method["balance"] = round(method["balance"] + p["amount"], 2)
    finally:  # tau2 changes balances in place, so a failure halfway through keeps the credits made so far
        if user is not None:
            db.put("users", user["user_id"], user)
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    order["payment_history"].extend(refunds)
    db.put("orders", order_id, order)
    return order


def _check_counts(order: dict, item_ids: list, message: str) -> None:
    # Duplicates are allowed in the request, but not more copies of an id than the order holds.
    held = [i["item_id"] for i in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > held.count(item_id):
            raise ValueError(message.format(item_id=item_id))


def _price_difference(db: Store, order: dict, item_ids: list, new_item_ids: list, same_id_check: bool):
    """Sum of (new price - old price) over the pairs, checking each pair; also returns the last variant seen."""
    diff, variant = 0, None  # the int 0: an empty request leaves the difference an int (tau2 stores it so)
    for item_id, new_item_id in zip(item_ids, new_item_ids):
        if same_id_check and item_id == new_item_id:
            raise ValueError("The new item id should be different from the old item id")
        item = next((i for i in order["items"] if i["item_id"] == item_id), None)
        if item is None:
            raise ValueError(f"Item {item_id} not found")
        variant = _variant(db, item["product_id"], new_item_id)  # the new item must be of the same product
        if not variant["available"]:
            raise ValueError(f"New item {new_item_id} not found or available")
        diff += variant["price"] - item["price"]
    return diff, variant


def exchange_delivered_order_items(
    db: Store, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> dict:
    """Ask to exchange items of a delivered order for other items (variants) of the same products.

    A delivered order can be returned or exchanged only once, so collect every item first. Explain the exchange
    and get an explicit "yes" from the customer first. The order's status becomes 'exchange requested'; the
    price difference is charged to, or refunded to, the given payment method. Returns the updated order.

    Args:
        order_id: The order id, such as '#W0000000' (with the leading '#').
        item_ids: Item ids to give back, such as ['1008292230']. An id may repeat if the order holds it twice.
        new_item_ids: The item ids wanted instead, position by position: each must be a variant of the same product
            as the item at the same position in item_ids.
        payment_method_id: The customer's payment method that pays or receives the price difference, such as
            'gift_card_0000000' or 'credit_card_0000000' (see the user's or the order's details).
    """
    order = _order_rec(db, order_id)
    if order["status"] != "delivered":
        raise ValueError("Non-delivered order cannot be exchanged")
    _check_counts(order, _id_list(item_ids, "item_ids"), "Number of {item_id} not found.")
    if len(item_ids) != len(_id_list(new_item_ids, "new_item_ids")):
        raise ValueError("The number of items to be exchanged should match.")
    diff, _ = _price_difference(db, order, item_ids, new_item_ids, same_id_check=False)
    diff = round(diff, 2)  # an exchange rounds its difference (a pending-order modification does not)
    method = _method(_user_rec(db, order["user_id"]), payment_method_id)
    if _is_gift_card(method) and method["balance"] < diff:
        raise ValueError("Insufficient gift card balance to pay for the price difference")
    # Nothing is paid yet: the request is recorded on the order and the gift card balance is left alone.
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(item_ids)
    order["exchange_new_items"] = sorted(new_item_ids)
    order["exchange_payment_method_id"] = payment_method_id
    order["exchange_price_difference"] = diff
    db.put("orders", order_id, order)
    return order


def modify_pending_order_address(
    db: Store, order_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> dict:
    """Change the shipping address of a pending order.

    Explain the change and get an explicit "yes" from the customer first. Returns the updated order.

    Args:
        order_id: The order id, such as '#W0000000' (with the leading '#').
        address1: First address line, such as '123 Main St'.
        address2: Second address line, such as 'Apt 1', or '' when there is none.
        city: City, such as 'San Francisco'.
        state: State, such as 'CA'.
        country: Country, such as 'USA'.
        zip: Zip code, such as '12345'.
    """
    order = _order_rec(db, order_id)
    if "pending" not in order["status"]:  # unlike cancel, 'pending (item modified)' passes this looser test
        raise ValueError("Non-pending order cannot be modified")
    order["address"] = _new_address(address1=address1, address2=address2, city=city, state=state, country=country, zip=zip)
    db.put("orders", order_id, order)
    return order


def modify_pending_order_items(
    db: Store, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> dict:
    """Swap items of a pending order for other items (variants) of the same products.

    This can be done only once per order (the status becomes 'pending (item modified)'), so collect every change
    first. Explain the change and get an explicit "yes" from the customer first. The price difference is charged
    to, or refunded to, the given payment method. Returns the updated order.

    Args:
        order_id: The order id, such as '#W0000000' (with the leading '#').
        item_ids: Item ids to replace, such as ['1008292230']. An id may repeat if the order holds it twice.
        new_item_ids: The replacement item ids, position by position: each must be a different variant of the
            same product as the item at the same position in item_ids.
        payment_method_id: The customer's payment method that pays or receives the price difference, such as
            'gift_card_0000000' or 'credit_card_0000000' (see the user's or the order's details).
    """
    order = _order_rec(db, order_id)
    if order["status"] != "pending":
        raise ValueError("Non-pending order cannot be modified")
    _check_counts(order, _id_list(item_ids, "item_ids"), "{item_id} not found")
    if len(item_ids) != len(_id_list(new_item_ids, "new_item_ids")):
        raise ValueError("The number of items to be exchanged should match")
    diff, variant = _price_difference(db, order, item_ids, new_item_ids, same_id_check=True)
    user = _user_rec(db, order["user_id"])
    method = _method(user, payment_method_id)
    if _is_gift_card(method) and method["balance"] < diff:
        raise ValueError("Insufficient gift card balance to pay for the new item")
    # QUIRK: the payment row is not rounded (e.g. 23.680000000000064), only the gift-card balance is.
    order["payment_history"].append(_payment("payment" if diff > 0 else "refund", abs(diff), payment_method_id))
    if _is_gift_card(method):
        method["balance"] = round(method["balance"] - diff, 2)
        db.put("users", user["user_id"], user)
    for item_id, new_item_id in zip(item_ids, new_item_ids):
        # QUIRK: items are found by id one pair at a time, after the earlier pairs renamed theirs, so with two
        # variants A, B of one product, [A, B] -> [B, X] rewrites the first item twice and never touches the second.
        item = next((i for i in order["items"] if i["item_id"] == item_id), None)
        if item is None:
            raise ValueError(f"Item {item_id} not found")
        item["item_id"] = new_item_id
        # QUIRK: price and options come from `variant`, the variant of the LAST pair checked above, so every
        # modified item gets the last new item's price and options (its id is still its own new id).
        item["price"] = variant["price"]
        item["options"] = variant["options"]
    order["status"] = "pending (item modified)"
    db.put("orders", order_id, order)
    return order


def modify_pending_order_payment(db: Store, order_id: str, payment_method_id: str) -> dict:
    """Pay for a pending order with a different payment method of the same customer.

    Explain the change and get an explicit "yes" from the customer first. The new method is charged the order
    amount and the old one refunded; gift-card balances change at once. Returns the updated order.

    Args:
        order_id: The order id, such as '#W0000000' (with the leading '#').
        payment_method_id: The new payment method, such as 'gift_card_0000000' or 'credit_card_0000000' (see the
            user's details); it must differ from the current one.
    """
    order = _order_rec(db, order_id)
    if "pending" not in order["status"]:
        raise ValueError("Non-pending order cannot be modified")
    user = _user_rec(db, order["user_id"])
    method = _method(user, payment_method_id)
    history = order["payment_history"]
    if len(history) != 1 or history[0]["transaction_type"] != "payment":
        raise ValueError("There should be exactly one payment for a pending order")
    old_id, amount = history[0]["payment_method_id"], history[0]["amount"]
    if old_id == payment_method_id:
        raise ValueError("The new payment method should be different from the current one")
    if _is_gift_card(method) and method["balance"] < amount:
        raise ValueError("Insufficient gift card balance to pay for the order")
    history += [_payment("payment", amount, payment_method_id), _payment("refund", amount, old_id)]
    db.put("orders", order_id, order)
    if _is_gift_card(method):  # charged before the old method is even looked up, as in tau2's order of steps
        method["balance"] = round(method["balance"] - amount, 2)
        db.put("users", user["user_id"], user)
    old = _method(user, old_id)
    if _is_gift_card(old):
        old["balance"] = round(old["balance"] + amount, 2)
        db.put("users", user["user_id"], user)
    return order


def modify_user_address(
    db: Store, user_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> dict:
    """Change a customer's default address (existing orders keep the address they were placed with).

    Explain the change and get an explicit "yes" from the customer first. Returns the updated user.

    Args:
        user_id: The user id, such as 'sara_doe_496'.
        address1: First address line, such as '123 Main St'.
        address2: Second address line, such as 'Apt 1', or '' when there is none.
        city: City, such as 'San Francisco'.
        state: State, such as 'CA'.
        country: Country, such as 'USA'.
        zip: Zip code, such as '12345'.
    """
    user = _user_rec(db, user_id)
    user["address"] = _new_address(address1=address1, address2=address2, city=city, state=state, country=country, zip=zip)
    db.put("users", user_id, user)
    return user


def return_delivered_order_items(db: Store, order_id: str, item_ids: list[str], payment_method_id: str) -> dict:
    """Ask to return items of a delivered order for a refund.

    A delivered order can be returned or exchanged only once, so collect every item first. Explain the return and
    get an explicit "yes" from the customer first. The order's status becomes 'return requested' and the customer
    gets an email saying how to send the items back. Returns the updated order.

    Args:
        order_id: The order id, such as '#W0000000' (with the leading '#').
        item_ids: Item ids to return, such as ['1008292230']. An id may repeat if the order holds it twice.
        payment_method_id: Where the refund goes: the order's original payment method or one of the customer's
            gift cards, such as 'gift_card_0000000' or 'credit_card_0000000'.
    """
    order = _order_rec(db, order_id)
    if order["status"] != "delivered":
        raise ValueError("Non-delivered order cannot be returned")
    method = _method(_user_rec(db, order["user_id"]), payment_method_id)
    # Any gift card of the user is accepted, not only the one the order was paid with.
    if not _is_gift_card(method) and payment_method_id != order["payment_history"][0]["payment_method_id"]:
        raise ValueError("Payment method should be the original payment method")
    _check_counts(order, _id_list(item_ids, "item_ids"), "Some item not found")
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    db.put("orders", order_id, order)
    return order


# ---------------------------------------------------------------------------------------------------------------
# The world

TOOLS = [
    calculate,
    cancel_pending_order,
    exchange_delivered_order_items,
    find_user_id_by_email,
    find_user_id_by_name_zip,
    get_item_details,
    get_order_details,
    get_product_details,
    get_user_details,
    list_all_product_types,
    modify_pending_order_address,
    modify_pending_order_items,
    modify_pending_order_payment,
    modify_user_address,
    return_delivered_order_items,
    transfer_to_human_agents,
    think,  # not a tau2 tool: a scratchpad that changes nothing (tools.py)
]
WRITE_TOOLS = {
    "cancel_pending_order",
    "exchange_delivered_order_items",
    "modify_pending_order_address",
    "modify_pending_order_items",
    "modify_pending_order_payment",
    "modify_user_address",
    "return_delivered_order_items",
}


def build_world(data_dir: str | None = None) -> World:
    """The retail World: template DB (built once per source + normaliser version), tools, policy and 114 tasks."""
    src = find_data("retail", data_dir)
    raw = src.read_bytes("db.json")
    db = normalise(json.loads(raw))
    policy = src.read_bytes("policy.md").decode("utf-8")
    key = content_key(raw, NORMALISER_VERSION)
    return World("retail", db, key, TOOLS, WRITE_TOOLS, policy, load_tasks(src, "retail"))


# ---------------------------------------------------------------------------------------------------------------
# Demo: replay one task's gold actions and score them.


def _short(text: str, n: int = 160) -> str:
    return text if len(text) <= n else text[:n] + f"... ({len(text)} chars)"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Replay one retail task's gold actions and print its reward.")
    ap.add_argument("--task", default=None, help="task id, e.g. 'retail/5' or '5' (default: first test task)")
    ap.add_argument("--data-dir", default=None, help="tau2 data folder (default: found by tau2_data.find_data)")
    args = ap.parse_args()
    world = build_world(args.data_dir)
    if args.task is None:
        task = world.tasks("test")[0]
    else:
        task = world.task(args.task if args.task.startswith("retail/") else f"retail/{args.task}")
    print(f"{task.id} ({task.split}): {_short(task.instructions, 300)}\n")
    env = world.new_env()
    for a in task.actions:
        out = env.call(a["name"], dict(a["arguments"]))
        tag = "WRITE " if a["name"] in WRITE_TOOLS else ""
        arrow = "-> ERROR" if env.calls[-1].error else "->"  # some gold calls fail on purpose in tau2's data
        print(f"{tag}{a['name']}({json.dumps(a['arguments'])})\n  {arrow} {_short(out)}")
    reward, info = world.score(task, env)
    print(f"\nreward = {reward}\ninfo = {json.dumps(info, indent=2)}")

"""The airline world: tau2-bench's flight-reservation database, its 14 tools, policy and 50 tasks.

MUA-RL (Zhao et al. 2025) trains and evaluates on tau2-bench's airline domain: an agent books, changes and
cancels flight reservations for a simulated customer, under a written policy, through these tools:

    read   get_user_details  get_reservation_details  get_flight_status  list_all_airports
           search_direct_flight  search_onestop_flight
    write  book_reservation  cancel_reservation  update_reservation_flights  update_reservation_baggages
           update_reservation_passengers  send_certificate
    other  calculate  transfer_to_human_agents   (tau2's generic tools)  and  think  (ours, changes nothing)

The reward compares the final database with the gold one (domains/base.py), so every tool must change the
database exactly as tau2's code does and answer with exactly tau2's text: tests/test_airline_parity.py replays
2,111 calls recorded from tau2 itself and compares every output byte and every changed record.

The database (collections of JSON documents, see base.py):
    flights       "HAT001" -> {flight_number, origin, destination, scheduled_*_time_est, dates: {date -> status}}
    users         "mia_li_3668" -> {user_id, name, address, email, dob, payment_methods, saved_passengers, ...}
    reservations  "4WQ150" -> {reservation_id, user_id, ..., flights, passengers, payment_history, ..., status}

db.json is not quite in the shape tau2 hands out: tau2 loads it into pydantic models and dumps them back,
which puts every field in the model's order and adds the optional fields it lacks. `normalise` does that
once, when the template is built, so outputs and the exported DB (and its sha256) match tau2's.

Money: prices, seat counts and payment rows are ints; gift-card and certificate balances are floats (a
float minus an int payment stays a float, never rounded). A payment amount such as 146.0 is stored as 146,
as tau2's pydantic Payment model does.

Departures from tau2-bench (all outside what tau2's recorded behaviour pins down):
1. An argument of the wrong type (a number where an id list belongs, a fractional payment, a baggage count
   "2") is refused with an "Error: ..." message of our own wording, before anything is written. tau2 either
   raises a pydantic error (different text) or, for plain assignments, stores the wrong-typed value.
2. Enumerated arguments (cabin, flight_type, insurance) are checked where tau2's Reservation model checks
   them; update_reservation_flights checks `cabin` before its flight loop (tau2 fails with a KeyError there,
   or stores the bad cabin when the flight list is empty).
3. Ids are matched exactly, as in the tau2 version the fixtures were recorded from (newer tau2 also folds
   case and accents for voice transcripts).
"""

from __future__ import annotations

import argparse
import json
from typing import Literal, TypedDict

from domains.base import Store, Task, World, content_key
from domains.tau2_data import find_data, load_tasks
from tools import calculate, think, transfer_to_human_agents

NORMALISER_VERSION = "airline-1"  # bump when normalise() changes: it is part of the template's cache key

CabinClass = Literal["business", "economy", "basic_economy"]
FlightType = Literal["round_trip", "one_way"]
Insurance = Literal["yes", "no"]

NOW = "2024-05-15T15:00:00"  # tau2's airline clock is frozen here; every booking gets it as created_at
NEW_RESERVATION_IDS = ["HATHAT", "HATHAU", "HATHAV"]  # tau2 assumes at most 3 bookings per task
NEW_CERTIFICATE_IDS = ["certificate_3221322", "certificate_3221323", "certificate_3221324"]
AIRPORTS = [
    ("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"),
    ("DFW", "Dallas"), ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"), ("MIA", "Miami"),
    ("BOS", "Boston"), ("PHX", "Phoenix"), ("IAH", "Houston"), ("LAS", "Las Vegas"), ("MCO", "Orlando"),
    ("EWR", "Newark"), ("CLT", "Charlotte"), ("MSP", "Minneapolis"), ("DTW", "Detroit"),
    ("PHL", "Philadelphia"), ("LGA", "LaGuardia"),
]  # fmt: skip

# ---------------------------------------------------------------------------------------------------------------
# Normalising db.json into tau2's model_dump() shape (checked by the base hash in tests/test_airline_parity.py)

FLIGHT_FIELDS = [
    "flight_number", "origin", "destination", "scheduled_departure_time_est", "scheduled_arrival_time_est", "dates",
]  # fmt: skip
SEGMENT_FIELDS = ["flight_number", "origin", "destination", "date", "price"]  # a reservation's flight


def _reorder(doc: dict, fields: list[str]) -> dict:
    return {f: doc.get(f) for f in fields}


def normalise(raw: dict) -> dict[str, dict[str, dict]]:
    """db.json -> {collection: {id: record}} exactly as tau2's FlightDB.model_dump() would give it.

    Flights and reservation segments are written with `origin` first in the file but the models declare
    `flight_number` first; reservations lack the optional `status` (None until cancelled). Users and the
    per-date flight statuses already match their models field for field.
    """
    flights = {k: _reorder(f, FLIGHT_FIELDS) for k, f in raw["flights"].items()}
    reservations = {}
    for k, r in raw["reservations"].items():
        r = dict(r, flights=[_reorder(s, SEGMENT_FIELDS) for s in r["flights"]])
        r.setdefault("status", None)
        reservations[k] = r
    return {"flights": flights, "users": raw["users"], "reservations": reservations}


# ---------------------------------------------------------------------------------------------------------------
# Structured arguments. The TypedDicts are what the model is shown (tools.function_schema renders them); the
# _as_* helpers check what actually arrives, with the coercions tau2's pydantic models apply.


class FlightInfo(TypedDict):
    """One flight of an itinerary.

    Attributes:
        flight_number: The flight number, such as 'HAT001'.
        date: The date of the flight, in the format 'YYYY-MM-DD', such as '2024-05-01'.
    """

    flight_number: str
    date: str


class Passenger(TypedDict):
    """A traveller.

    Attributes:
        first_name: The passenger's first name, such as 'Noah'.
        last_name: The passenger's last name, such as 'Brown'.
        dob: The passenger's date of birth, in the format 'YYYY-MM-DD', such as '1990-01-01'.
    """

    first_name: str
    last_name: str
    dob: str


class Payment(TypedDict):
    """One part of a payment.

    Attributes:
        payment_id: The id of a payment method in the user's profile, such as 'credit_card_7815826'.
        amount: The amount to charge to this payment method.
    """

    payment_id: str
    amount: int


def _as_int(value, what: str) -> int:
    # pydantic's lax int: ints, floats with no fractional part (146.0 -> 146), integer strings. bool is refused.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError(f"{what} must be an integer, got {value!r}")


def _as_float(value, what: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ValueError(f"{what} must be a number, got {value!r}")


def _records(value, fields: list[str], what: str) -> list[dict]:
    """A list of objects with string `fields` -> clean dicts in field order; unknown keys dropped, like tau2."""
    if not isinstance(value, list):
        raise ValueError(f"{what} must be a list of objects, got {value!r}")
    out = []
    for item in value:
        if not isinstance(item, dict):
            raise ValueError(f"each entry of {what} must be an object, got {item!r}")
        for f in fields:
            if not isinstance(item.get(f), str):
                raise ValueError(f"each entry of {what} needs a string '{f}', got {item!r}")
        out.append({f: item[f] for f in fields})
    return out


def _payments(value) -> list[dict]:
    if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
        raise ValueError(f"payment_methods must be a list of objects, got {value!r}")
    out = []
    for p in value:
        if not isinstance(p.get("payment_id"), str):
            raise ValueError(f"each payment needs a string 'payment_id', got {p!r}")
        out.append({"payment_id": p["payment_id"], "amount": _as_int(p.get("amount"), "payment amount")})
    return out


def _choice(value, allowed: tuple, what: str) -> str:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------------------------
# Lookups. Messages are tau2's; a non-string id simply matches nothing (Store.get), as a dict lookup would.


def _user(db: Store, user_id) -> dict:
    user = db.get("users", user_id)
    if user is None:
        raise ValueError(f"User {user_id} not found")
    return user


def _reservation(db: Store, reservation_id) -> dict:
    res = db.get("reservations", reservation_id)
    if res is None:
        raise ValueError(f"Reservation {reservation_id} not found")
    return res


def _flight(db: Store, flight_number) -> dict:
    flight = db.get("flights", flight_number)
    if flight is None:
        raise ValueError(f"Flight {flight_number} not found")
    return flight


def _flight_day(flight: dict, date) -> dict:
    if date not in flight["dates"]:
        raise ValueError(f"Flight {flight['flight_number']} not found on date {date}")
    return flight["dates"][date]


def _route(db: Store, origin=None, destination=None) -> list[dict]:
    """Flights (whole documents, in tau2's order) with this origin and destination; None matches any.

    The filter runs in SQL (json_extract on the documents), so only the few flights on the route are decoded
    in Python. A value that is not a string can never equal a flight's airport: the answer is empty, as in tau2.
    """
    where, params = [], []
    for field, value in (("origin", origin), ("destination", destination)):
        if value is None:
            continue
        if not isinstance(value, str):
            return []
        where.append(f"json_extract(doc, '$.{field}') = ?")  # `field` is one of two fixed names, never input
        params.append(value)
    return [f for _, f in db.query("flights", " AND ".join(where) or "1", tuple(params))]


def _bookable(flights: list[dict], date, leave_after=None) -> list[dict]:
    """tau2's DirectFlight records for the flights that are 'available' on `date` (and leave after `leave_after`)."""
    results = []
    for f in flights:
        if date not in f["dates"] or f["dates"][date]["status"] != "available":  # a list as date raises, as in tau2
            continue
        if leave_after is not None and f["scheduled_departure_time_est"] < leave_after:
            continue
        day = f["dates"][date]
        results.append({
            "flight_number": f["flight_number"], "origin": f["origin"], "destination": f["destination"],
            "status": "available", "scheduled_departure_time_est": f["scheduled_departure_time_est"],
            "scheduled_arrival_time_est": f["scheduled_arrival_time_est"], "date": None,
            "available_seats": day["available_seats"], "prices": day["prices"],
        })  # fmt: skip
    return results


def _charge_for_update(db: Store, user: dict, payment_id, total: int) -> dict | None:
    """tau2's _payment_for_update: check the method, take `total` off a gift card, return the payment row.

    `total` may be negative (a cheaper itinerary): a gift card is then topped up, a credit card gets a
    negative row. Certificates are always refused, even for a zero total. A zero total adds no row.
    """
    method = user["payment_methods"].get(payment_id) if isinstance(payment_id, str) else None
    if method is None:
        raise ValueError("Payment method not found")
    if method["source"] == "certificate":
        raise ValueError("Certificate cannot be used to update reservation")
    if method["source"] == "gift_card" and method["amount"] < total:
        raise ValueError("Gift card balance is not enough")
    if method["source"] == "gift_card":
        method["amount"] -= total  # float - int: stays a float, not rounded
        db.put("users", user["user_id"], user)
    return {"payment_id": payment_id, "amount": total} if total != 0 else None


# ---------------------------------------------------------------------------------------------------------------
# Read tools


def get_user_details(db: Store, user_id: str) -> dict:
    """Look up a user's profile: name, address, email, birth date, payments, passengers, membership, reservations.

    Args:
        user_id: The user's id, such as 'sara_doe_496'.
    """
    return _user(db, user_id)


def get_reservation_details(db: Store, reservation_id: str) -> dict:
    """Look up a reservation: its flights, passengers, cabin, baggage, insurance and payment history.

    Args:
        reservation_id: The reservation id, such as '8JX2WO'.
    """
    return _reservation(db, reservation_id)


def get_flight_status(db: Store, flight_number: str, date: str) -> str:
    """Tell the status of one flight on one date: available, on time, delayed, flying, landed or cancelled.

    Args:
        flight_number: The flight number, such as 'HAT001'.
        date: The date of the flight, in the format 'YYYY-MM-DD'.
    """
    return _flight_day(_flight(db, flight_number), date)["status"]


def list_all_airports(db: Store) -> list:
    """List every airport the airline serves, as IATA codes with their cities."""
    return [{"iata": code, "city": city} for code, city in AIRPORTS]


def search_direct_flight(db: Store, origin: str, destination: str, date: str) -> list:
    """Find nonstop flights between two airports on a date that can still be booked, with seats and prices.

    Args:
        origin: The three-letter code of the departure airport, such as 'JFK'.
        destination: The three-letter code of the arrival airport, such as 'LAX'.
        date: The date of travel, in the format 'YYYY-MM-DD', such as '2024-05-01'.
    """
    return _bookable(_route(db, origin, destination), date)


def search_onestop_flight(db: Store, origin: str, destination: str, date: str) -> list:
    """Find one-stop itineraries between two airports on a date, as [first leg, second leg] pairs with prices.

    Args:
        origin: The three-letter code of the departure airport, such as 'JFK'.
        destination: The three-letter code of the arrival airport, such as 'LAX'.
        date: The date of the first leg, in the format 'YYYY-MM-DD', such as '2024-05-01'.
    """
    # Two SQL queries, not one per first leg: every flight out of `origin`, every flight into `destination`;
    # the pairs are then formed in Python in tau2's order (first legs in flight order, then second legs).
    into_destination = _route(db, None, destination)
    pairs = []
    for first in _bookable(_route(db, origin, None), date):
        first["date"] = date
        # Quirk kept from tau2: a first leg landing after midnight ("+1") connects on the next day, written
        # without zero padding, so a connection on 2024-05-02..09 (written '2024-05-2') is never found.
        date2 = f"2024-05-{int(date[-2:]) + 1}" if "+1" in first["scheduled_arrival_time_est"] else date
        # the connection must leave at or after the first leg lands (a plain string comparison, as in tau2)
        legs = [f for f in into_destination if f["origin"] == first["destination"]]
        for second in _bookable(legs, date2, first["scheduled_arrival_time_est"]):
            second["date"] = date2
            pairs.append([first, second])
    return pairs


# ---------------------------------------------------------------------------------------------------------------
# Write tools. Each reads, checks, then writes, in tau2's order, so a refusal leaves the database untouched
# (the one partial write tau2 makes is reproduced and marked).


def book_reservation(
    db: Store,
    user_id: str,
    origin: str,
    destination: str,
    flight_type: FlightType,
    cabin: CabinClass,
    flights: list[FlightInfo],
    passengers: list[Passenger],
    payment_methods: list[Payment],
    total_baggages: int,
    nonfree_baggages: int,
    insurance: Insurance,
) -> dict:
    """Book a new reservation for a user and charge it; returns the reservation.

    Price: each flight's current price in the cabin, times the number of passengers.
    Plus 30 per passenger with insurance, plus 50 per non-free bag; the payment amounts must add up to it.

    Args:
        user_id: The id of the user who books, such as 'sara_doe_496'.
        origin: The IATA code of the trip's origin, such as 'SFO'.
        destination: The IATA code of the trip's destination, such as 'JFK'.
        flight_type: 'one_way' or 'round_trip'.
        cabin: 'basic_economy', 'economy' or 'business'; the same for every flight.
        flights: Every flight of the trip, in order, each with its flight number and date.
        passengers: Every traveller, each with first name, last name and date of birth.
        payment_methods: How the price is split over the user's payment methods, each with an id and amount.
        total_baggages: The total number of checked bags.
        nonfree_baggages: How many of those bags are paid for.
        insurance: 'yes' or 'no' for travel insurance.
    """
    flights = _records(flights, ["flight_number", "date"], "flights")
    passengers = _records(passengers, ["first_name", "last_name", "dob"], "passengers")
    payments = _payments(payment_methods)
    user = _user(db, user_id)
    reservation_id = next((r for r in NEW_RESERVATION_IDS if not db.contains("reservations", r)), None)
    if reservation_id is None:
        raise ValueError("Too many reservations")
    # tau2 builds its Reservation model here, which validates these fields
    for name, value in (("origin", origin), ("destination", destination)):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {value!r}")
    _choice(flight_type, ("round_trip", "one_way"), "flight_type")
    _choice(cabin, ("business", "economy", "basic_economy"), "cabin")
    _choice(insurance, ("yes", "no"), "insurance")
    bags, paid_bags = _as_int(total_baggages, "total_baggages"), _as_int(nonfree_baggages, "nonfree_baggages")

    n, total, segments, touched = len(passengers), 0, [], {}
    for fi in flights:
        number = fi["flight_number"]
        flight = touched.get(number) or _flight(db, number)  # one doc per flight number, so seats add up
        day = _flight_day(flight, fi["date"])
        if day["status"] != "available":
            raise ValueError(f"Flight {number} not available on date {fi['date']}")
        if day["available_seats"][cabin] < n:  # checked against the seats before this booking, per segment
            raise ValueError(f"Not enough seats on flight {number}")
        price = day["prices"][cabin]
        segments.append({"flight_number": number, "origin": flight["origin"], "destination": flight["destination"],
                         "date": fi["date"], "price": price})  # fmt: skip
        touched[number] = flight
        total += price * n
    if insurance == "yes":
        total += 30 * n
    total += 50 * nonfree_baggages  # the raw argument, as tau2 (a 1.0 makes the total print as a float)

    for p in payments:
        method = user["payment_methods"].get(p["payment_id"])
        if method is None:
            raise ValueError(f"Payment method {p['payment_id']} not found")
        # each entry is checked on its own, so one gift card listed twice can overdraw it (tau2 quirk)
        if method["source"] in ("gift_card", "certificate") and method["amount"] < p["amount"]:
            raise ValueError(f"Not enough balance in payment method {p['payment_id']}")
    paid = sum(p["amount"] for p in payments)
    if paid != total:
        raise ValueError(f"Payment amount does not add up, total price is {total}, but paid {paid}")

    for p in payments:
        method = user["payment_methods"].get(p["payment_id"])
        if method is None:
            # tau2 quirk: a certificate listed twice was popped by the first entry; the second pop raises
            # KeyError *after* the earlier deductions, which stay written (tau2 mutates its models in place).
            db.put("users", user["user_id"], user)
            raise KeyError(p["payment_id"])
        if method["source"] == "gift_card":
            method["amount"] -= p["amount"]
        elif method["source"] == "certificate":
            del user["payment_methods"][p["payment_id"]]  # a certificate is spent whole, whatever was used

    for number, flight in touched.items():
        for fi in flights:
            if fi["flight_number"] == number:
                flight["dates"][fi["date"]]["available_seats"][cabin] -= n
        db.put("flights", number, flight)
    reservation = {
        "reservation_id": reservation_id, "user_id": user_id, "origin": origin, "destination": destination,
        "flight_type": flight_type, "cabin": cabin, "flights": segments, "passengers": passengers,
        "payment_history": payments, "created_at": NOW, "total_baggages": bags, "nonfree_baggages": paid_bags,
        "insurance": insurance, "status": None,
    }  # fmt: skip
    db.put("reservations", reservation_id, reservation)
    user["reservations"].append(reservation_id)
    db.put("users", user["user_id"], user)
    return reservation


def cancel_reservation(db: Store, reservation_id: str) -> dict:
    """Cancel a whole reservation and refund every payment to where it came from; returns the reservation.

    Args:
        reservation_id: The reservation id, such as 'ZFA04Y'.
    """
    res = _reservation(db, reservation_id)
    # tau2 quirks, kept: nothing is checked (a cancelled or past reservation is cancelled again), each call
    # appends a negated copy of every row already in the history (earlier refunds included), and neither the
    # seats nor the gift-card / certificate balances are given back.
    res["payment_history"] += [{"payment_id": p["payment_id"], "amount": -p["amount"]} for p in res["payment_history"]]
    res["status"] = "cancelled"
    db.put("reservations", res["reservation_id"], res)
    return res


def update_reservation_flights(
    db: Store, reservation_id: str, cabin: CabinClass, flights: list[FlightInfo], payment_id: str
) -> dict:
    """Change the flights and/or cabin of a reservation and settle the price difference; returns the reservation.

    Args:
        reservation_id: The reservation id, such as 'ZFA04Y'.
        cabin: The cabin class for the whole new itinerary.
        flights: The COMPLETE new itinerary, each flight with its number and date; list unchanged flights too.
        payment_id: The payment method in the user's profile that pays or receives the difference, such as
            'credit_card_7815826' or 'gift_card_7815826'. Certificates cannot be used.
    """
    flights = _records(flights, ["flight_number", "date"], "flights")
    res = _reservation(db, reservation_id)
    user = _user(db, res["user_id"])
    _choice(cabin, ("business", "economy", "basic_economy"), "cabin")  # departure 2 in the module docstring
    n, total, segments = len(res["passengers"]), 0, []
    for fi in flights:
        # A segment keeps its old price only if number, date AND cabin are unchanged (tau2's rule)
        kept = next((s for s in res["flights"] if s["flight_number"] == fi["flight_number"]
                     and s["date"] == fi["date"] and cabin == res["cabin"]), None)  # fmt: skip
        if kept is not None:
            total += kept["price"] * n
            segments.append(kept)
            continue
        flight = _flight(db, fi["flight_number"])
        day = _flight_day(flight, fi["date"])
        if day["status"] != "available":
            raise ValueError(f"Flight {fi['flight_number']} not available on date {fi['date']}")
        if day["available_seats"][cabin] < n:
            raise ValueError(f"Not enough seats on flight {fi['flight_number']}")
        price = day["prices"][cabin]
        segments.append({"flight_number": fi["flight_number"], "origin": flight["origin"],
                         "destination": flight["destination"], "date": fi["date"], "price": price})  # fmt: skip
        total += price * n
    total -= sum(s["price"] for s in res["flights"]) * n  # minus what the old itinerary cost
    payment = _charge_for_update(db, user, payment_id, total)
    if payment is not None:
        res["payment_history"].append(payment)
    res["flights"], res["cabin"] = segments, cabin
    # tau2 quirk, kept: seat counts are not updated (neither released on the old flights nor taken on the new)
    db.put("reservations", res["reservation_id"], res)
    return res


def update_reservation_baggages(
    db: Store, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str
) -> dict:
    """Change the number of checked bags of a reservation; each added non-free bag costs 50. Returns the reservation.

    Args:
        reservation_id: The reservation id, such as 'ZFA04Y'.
        total_baggages: The new total number of checked bags.
        nonfree_baggages: The new number of paid bags.
        payment_id: The payment method in the user's profile that pays for added bags, such as
            'credit_card_7815826' or 'gift_card_7815826'. Certificates cannot be used.
    """
    res = _reservation(db, reservation_id)
    user = _user(db, res["user_id"])
    for name, value in (("total_baggages", total_baggages), ("nonfree_baggages", nonfree_baggages)):
        if not isinstance(value, int) or isinstance(value, bool):  # departure 1: tau2 would store it as sent
            raise ValueError(f"{name} must be an integer, got {value!r}")
    total = 50 * max(0, nonfree_baggages - res["nonfree_baggages"])  # fewer bags refund nothing
    payment = _charge_for_update(db, user, payment_id, total)
    if payment is not None:
        res["payment_history"].append(payment)
    res["total_baggages"], res["nonfree_baggages"] = total_baggages, nonfree_baggages
    db.put("reservations", res["reservation_id"], res)
    return res


def update_reservation_passengers(db: Store, reservation_id: str, passengers: list[Passenger]) -> dict:
    """Replace the passenger details of a reservation; the number of passengers cannot change. Returns the reservation.

    Args:
        reservation_id: The reservation id, such as 'ZFA04Y'.
        passengers: Every passenger, each with first name, last name and date of birth.
    """
    passengers = _records(passengers, ["first_name", "last_name", "dob"], "passengers")
    res = _reservation(db, reservation_id)
    if len(passengers) != len(res["passengers"]):
        raise ValueError("Number of passengers does not match")
    res["passengers"] = passengers
    db.put("reservations", res["reservation_id"], res)
    return res


def send_certificate(db: Store, user_id: str, amount: float) -> str:
    """Give a user a travel certificate worth `amount`, for example as compensation. Use with care.

    Args:
        user_id: The id of the user who receives it, such as 'sara_doe_496'.
        amount: The value of the certificate.
    """
    user = _user(db, user_id)
    # tau2 quirk: three fixed ids; a spent certificate frees its id, a fourth live one fails
    cert_id = next((c for c in NEW_CERTIFICATE_IDS if c not in user["payment_methods"]), None)
    if cert_id is None:
        raise ValueError("Too many certificates")
    user["payment_methods"][cert_id] = {"source": "certificate", "id": cert_id, "amount": _as_float(amount, "amount")}
    db.put("users", user["user_id"], user)
    # stored as a float, but echoed as sent: 'with amount 50.' for 50, 'with amount 50.0.' for "50.0"
    return f"Certificate {cert_id} added to user {user_id} with amount {amount}."


# ---------------------------------------------------------------------------------------------------------------
# The world

TOOLS = [  # tau2's 14 tools, then think
    book_reservation, calculate, cancel_reservation, get_flight_status, get_reservation_details,
    get_user_details, list_all_airports, search_direct_flight, search_onestop_flight, send_certificate,
    transfer_to_human_agents, update_reservation_baggages, update_reservation_flights,
    update_reservation_passengers, think,
]  # fmt: skip
WRITE_TOOLS = {
    "book_reservation", "cancel_reservation", "update_reservation_flights", "update_reservation_baggages",
    "update_reservation_passengers", "send_certificate",
}  # fmt: skip


def build_world(data_dir=None) -> World:
    """The airline World: template DB (built once, cached by content), tools, policy and tau2's 50 tasks."""
    src = find_data("airline", data_dir)
    raw = src.read_bytes("db.json")
    return World(
        name="airline",
        db=normalise(json.loads(raw)),
        key=content_key(raw, NORMALISER_VERSION),
        tools=TOOLS,
        write_tools=WRITE_TOOLS,
        rules=src.read_bytes("policy.md").decode(),
        tasks=load_tasks(src, "airline"),
    )


def replay_task(world: World, task: Task, width: int = 160) -> float:
    """Replay a task's gold actions on a fresh env, printing each call, and score the result."""
    env = world.new_env()
    print(f"task {task.id} ({task.split}): {len(task.actions)} gold actions\n{task.instructions[:400]}\n")
    for a in task.actions:
        out = env.call(a["name"], json.loads(json.dumps(a["arguments"])))
        mark = "!!" if env.calls[-1].error else "->"  # some gold actions fail on purpose, as in tau2
        print(f"{mark} {a['name']}({json.dumps(a['arguments'])[:width]})")
        print(f"   {out[:width]}{' ...' if len(out) > width else ''}")
    reward, info = world.score(task, env)
    print(f"\nreward {reward}  {info}")
    return reward


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Replay one airline task's gold actions and score them.")
    ap.add_argument("--task", help="task id, e.g. 'airline/2' or '2' (default: the first test-split task)")
    ap.add_argument("--data-dir", help="tau2 data folder (default: $TAU2_DATA_DIR, ../shared/tau2/data, wheel)")
    args = ap.parse_args()
    w = build_world(args.data_dir)
    if args.task:
        t = w.task(args.task if args.task.startswith("airline/") else f"airline/{args.task}")
    else:
        t = w.tasks("test")[0]
    replay_task(w, t)

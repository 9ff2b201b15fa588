"""ACEBench's five scenario apps (the Agent category, English): a phone (Wi-Fi and login flags, messages,
reminders, a food-delivery platform) and an airline booking system, as small in-memory Python objects.

ACEBench (arXiv 2501.12851) runs an agent's `[name(key=value)]` calls as plain method calls on these objects and
scores the attributes they end with, so everything observable here is reproduced exactly: the class and method
names and parameter names (a wrong keyword gives Python's own TypeError text, "MessageApi.send_message() got an
unexpected keyword argument 'x'", which the multi-step agent sees), the order in which checks run, the texts, the
numeric types (balances are floats, ticket prices ints), the attribute order of each instance (the evaluator's
error texts print them), and the quirks `../shared/acebench/AGENT.md` lists, e.g.:

    - messages sent by send_message have no "time", so the latest/earliest tools raise KeyError('time') after it;
    - the inbox and reminder lists are dicts keyed by int; new ids continue the counters (message 7, reminder 4);
    - each phone app keeps its own Wi-Fi / login flags (the executor loads all of them from the BaseApi config);
    - cancelling a flight refunds to cash and keeps the reservation; lookups take the first flight of a number.

Only public methods are tools (the executor dispatches every public method, listed in the task or not), so the
helpers here are `_private`. What the tools print to ACEBench's console (the agent never sees it) goes to
`self._console`, which the executor collects. tests/test_acebench_parity.py checks all of it against the fixtures.
"""

from __future__ import annotations

from datetime import datetime, timedelta

# The fixed data every task starts from (AGENT.md section 3), as (key, value) rows expanded by the constructors.
PEOPLE = [("Eve", "USR100", "123-456-7890", "Software Engineer"), ("Frank", "USR101", "234-567-8901", "Data Scientist"),
          ("Grace", "USR102", "345-678-9012", "Product Manager"), ("Helen", "USR103", "456-789-0123", "UX Designer"),
          ("Isaac", "USR104", "567-890-1234", "DevOps Engineer"),
          ("Jack", "USR105", "678-901-2345", "Marketing Specialist")]
INBOX = [("USR100", "USR101", "Hey Frank, don't forget about our meeting on 2024-06-11 at 4 PM in Conference Room 1.",
          "2024-06-09"),
         ("USR101", "USR102", 'Can you help me order a "Margherita Pizza" delivery? The merchant is Domino\'s.',
          "2024-03-09"),
         ("USR102", "USR103", "Please check the milk tea delivery options available from Heytea and purchase a cheaper "
          'milk tea for me. After making the purchase, remember to reply to me with "Already bought."', "2023-12-05"),
         ("USR103", "USR102", "No problem Helen, I can assist you.", "2024-09-09"),
         ("USR104", "USR105", "Isaac, are you available for a call?", "2024-06-06"),
         ("USR105", "USR104", "Yes Jack, let's do it in 30 minutes.", "2024-01-15")]
REMINDERS = [(1001, "Doctor's Appointment", "Visit Dr. Smith for a checkup.", "2024-07-15 09:30"),
             (1002, "Team Meeting", "Monthly project review with the team.", "2024-07-17 11:00"),
             (1003, "To-do list", 'First, help Frank place a food delivery order at "Hema Fresh," ordering two '
              '"Fresh Gift Packs." Then, send a message to Frank saying, "The price of the purchased goods is () '
              'yuan." Replace the parentheses with the actual amount, keeping one decimal place.', "2024-07-16 11:00")]
FOOD_USERS = [("Eve", "U100", "password123", 500.0), ("Frank", "U101", "password456", 300.0),
              ("Grace", "U102", "password789", 150.0), ("Helen", "U103", "password321", 800.0),
              ("Isaac", "U104", "password654", 400.0), ("Jack", "U105", "password654", 120.0)]
MERCHANTS = [("Domino's", "M100", "Pizza", [("Margherita Pizza", 68.0), ("Super Supreme Pizza", 88.0)]),
             ("Rice Village Bibimbap", "M101", "Bibimbap",
              [("Stone Pot Bibimbap", 35.0), ("Korean Beef Bibimbap", 45.0)]),
             ("Haidilao", "M102", "Hotpot", [("Beef Rolls", 68.0), ("Seafood Platter", 88.0)]),
             ("Heytea", "M103", "Milk Tea", [("Cheese Milk Tea", 25.0), ("Four Seasons Spring Milk Tea", 22.0)]),
             ("Hema Fresh", "M104", "Fresh Grocery", [("Organic Vegetable Pack", 15.0), ("Fresh Gift Pack", 99.0)]),
             ("Jiutian BBQ", "M105", "BBQ", [("Korean Grilled Beef", 128.0), ("Grilled Pork Belly", 78.0)])]
TRAVELLERS = [("user1", "Eve", "password123", 2000.0, 50000.0, "regular"),
              ("user2", "Frank", "password456", 8000.0, 8000.0, "silver"),
              ("user3", "Grace", "password789", 1000.0, 5000.0, "gold")]
FLIGHTS = [("CA1234", "Beijing", "Shanghai", "2024-07-15 08:00:00", "2024-07-15 10:30:00", 5, 1200, 3000),
           ("MU5678", "Shanghai", "Beijing", "2024-07-16 09:00:00", "2024-07-16 11:30:00", 3, 1900, 3000),
           ("CZ4321", "Shanghai", "Beijing", "2024-07-16 20:00:00", "2024-07-16 22:00:00", 8, 2500, 4000),
           ("CZ4352", "Shanghai", "Beijing", "2024-07-17 20:00:00", "2024-07-17 22:00:00", 8, 1600, 2500),
           ("MU3561", "Beijing", "Nanjing", "2024-07-18 08:00:00", "2024-07-18 10:00:00", 8, 1500, 4000),
           ("MU1566", "Beijing", "Nanjing", "2024-07-18 20:00:00", "2024-07-18 22:00:00", 8, 1500, 4000),
           ("CZ1765", "Nanjing", "Shenzhen", "2024-07-17 20:30:00", "2024-07-17 22:00:00", 8, 1500, 2500),
           ("CZ1765", "Nanjing", "Shenzhen", "2024-07-18 12:30:00", "2024-07-18 15:00:00", 8, 1500, 2500),
           ("MH1765", "Xiamen", "Chengdu", "2024-07-17 12:30:00", "2024-07-17 15:00:00", 8, 1500, 2500),
           ("MH2616", "Chengdu", "Xiamen", "2024-07-18 18:30:00", "2024-07-18 21:00:00", 8, 1500, 2500),
           ("MH2616", "Chengdu", "Fuzhou", "2024-07-16 18:30:00", "2024-07-16 21:00:00", 8, 1500, 2500)]
RESERVATIONS = [("res_1", "user1", "CA1234", "Economy Class", "Beijing", "Shanghai"),
                ("res_2", "user1", "MU5678", "Business Class", "Shanghai", "Beijing"),
                ("res_3", "user2", "MH1765", "Business Class", "Xiamen", "Chengdu"),
                ("res_4", "user2", "MU2616", "Business Class", "Chengdu", "Xiamen")]  # MU2616: no such flight
FREE_BAGS = {"regular": {"Economy Class": 1, "Business Class": 2}, "silver": {"Economy Class": 2, "Business Class": 3},
             "gold": {"Economy Class": 3, "Business Class": 3}}
NOW = datetime(2024, 7, 14, 6, 0, 0)  # cancel_reservation's clock (the agent's prompt says July 15, 08:00)


def _fail(message: str) -> dict:
    return {"status": False, "message": message}


# ---------------------------------------------------------------------------------------------------------------
# The phone


class BaseApi:
    """Wi-Fi and device login. The other phone apps inherit these two tools (so a call runs on each of them)."""

    def __init__(self):
        self.wifi = False
        self.logged_in = True

    def _load_scenario(self, scenario: dict, long_context=False) -> None:
        self.wifi = scenario.get("wifi", False)
        self.logged_in = scenario.get("logged_in", True)

    def turn_on_wifi(self):
        """Wi-Fi on (on every app that inherits it: the executor calls each one)."""
        self.wifi = True
        return {"status": True, "message": "Wi-Fi has been turned on"}

    def login_device(self):
        """Log the device in (there is no way to log out)."""
        self.logged_in = True
        return {"status": True, "message": "Device has been logged in"}


class MessageApi(BaseApi):
    """Six users and a six-slot inbox (full at the start), keyed by int message id."""

    def __init__(self):
        super().__init__()  # the only app that runs BaseApi's constructor: wifi / logged_in come first in its dict
        self.max_capacity = 6
        self.user_list = {n: {"user_id": u, "phone_number": p, "occupation": o} for n, u, p, o in PEOPLE}
        self.inbox = {i: {"sender_id": s, "receiver_id": r, "message": m, "time": t}
                      for i, (s, r, m, t) in enumerate(INBOX, 1)}
        self.message_id_counter = 6

    def send_message(self, sender_name, receiver_name, message):
        """Checks run in this order: login, Wi-Fi, a full inbox (6), both names known."""
        if self.logged_in == False:  # noqa: E712 - ACEBench compares with ==, and so do we
            return _fail("Device not logged in, unable to send message")
        if self.wifi == False:  # noqa: E712
            return _fail("Wi-Fi is turned off, cannot send messages at this time")
        if len(self.inbox) >= self.max_capacity:
            return _fail("Inbox capacity is full. You need to ask the user which message to delete.")
        if sender_name not in self.user_list or receiver_name not in self.user_list:
            return _fail("Sender or receiver does not exist")
        self.message_id_counter += 1
        self.inbox[self.message_id_counter] = {"sender_id": self.user_list[sender_name]["user_id"],
                                               "receiver_id": self.user_list[receiver_name]["user_id"],
                                               "message": message}  # no "time": see get_latest_message_id
        return {"status": True, "message": f"Message successfully sent to {receiver_name}."}

    def delete_message(self, message_id):
        """Delete by key; the reply echoes the id as given (3.0, True ...)."""
        if self.logged_in == False:  # noqa: E712
            return _fail("Device not logged in, unable to delete message")
        if message_id not in self.inbox:  # dict membership: "3" misses, 3.0 and True hit keys 3 and 1
            return _fail("Message ID does not exist")
        del self.inbox[message_id]
        return {"status": True, "message": f"Message ID {message_id} has been successfully deleted."}

    def view_messages_between_users(self, sender_name, receiver_name):
        """Messages from sender to receiver only (one direction), in inbox order."""
        if self.logged_in == False:  # noqa: E712
            return _fail("Device not logged in, unable to view message information")
        if sender_name not in self.user_list:
            return _fail("Sender does not exist")
        if receiver_name not in self.user_list:
            return _fail("Receiver does not exist")
        frm, to = self.user_list[sender_name]["user_id"], self.user_list[receiver_name]["user_id"]
        found = [{"id": i, "sender": sender_name, "receiver": receiver_name, "message": m["message"]}
                 for i, m in self.inbox.items() if m["sender_id"] == frm and m["receiver_id"] == to]
        return {"status": True, "messages": found} if found else _fail("No related message records found")

    def search_messages(self, user_name, keyword):
        """Case-insensitive keyword over the messages the user sent or received."""
        if user_name not in self.user_list:  # (no login check here)
            return _fail("User does not exist")
        uid, found = self.user_list[user_name]["user_id"], []
        for i, m in self.inbox.items():
            # the keyword is lowered only for the user's own messages (a non-string keyword fails only then)
            if (m["sender_id"] == uid or m["receiver_id"] == uid) and keyword.lower() in m["message"].lower():
                found.append({"id": i, "sender_id": m["sender_id"], "receiver_id": m["receiver_id"],
                              "message": m["message"]})
        return {"status": True, "messages": found} if found else _fail("No messages found containing the keyword")

    def get_all_message_times_with_ids(self):
        """{id: time} with int keys (the agent sees them as strings, after JSON)."""
        if self.logged_in == False:  # noqa: E712
            return _fail("Device not logged in, unable to retrieve all message times and their corresponding "
                         "message IDs.")
        return {i: m["time"] for i, m in self.inbox.items()}

    def get_latest_message_id(self):
        """The newest message by its date (KeyError 'time' once a sent message is in the inbox)."""
        if self.logged_in == False:  # noqa: E712
            return _fail("Device not logged in, unable to retrieve the latest sent message ID.")
        return self._extreme_id("latest", lambda new, best: new > best)

    def get_earliest_message_id(self):
        """The oldest message by its date (same KeyError as above)."""
        if self.logged_in == False:  # noqa: E712
            return _fail("Device not logged in, unable to retrieve the earliest sent message ID.")
        return self._extreme_id("earliest", lambda new, best: new < best)

    def _extreme_id(self, which: str, better) -> dict:
        if not self.inbox:
            return _fail("No message records found")
        best_id, best = None, None
        for i, m in self.inbox.items():  # a strict comparison: ties keep the first; a message without time raises
            t = datetime.strptime(m["time"], "%Y-%m-%d")
            if best is None or better(t, best):
                best_id, best = i, t
        return {"status": True, "message": f"The {which} message ID is {best_id}", "message_id": best_id}


class ReminderApi(BaseApi):
    """Reminders keyed 1..3 (their reminder_id fields say 1001..1003); new ones get key = reminder_id = 4, 5, ..."""

    def __init__(self):  # BaseApi's constructor is not run: wifi / logged_in arrive with _load_scenario, last
        self.max_capacity = 6
        self.reminder_list = {i: {"reminder_id": r, "title": t, "description": d, "time": w, "notified": False}
                              for i, (r, t, d, w) in enumerate(REMINDERS, 1)}
        self.reminder_id_counter = 3

    def view_reminder_by_title(self, title):
        """The first reminder whose title is exactly `title`."""
        if self.logged_in == False:  # noqa: E712
            return _fail("The device is not logged in, so you cannot view notifications")
        for reminder in self.reminder_list.values():
            if reminder["title"] == title:
                return {"status": True, "reminder": reminder}
        return _fail(f"No reminder found with the title '{title}'.")

    def add_reminder(self, title, description, time):
        """A new reminder at key = reminder_id = the next counter value (4 first)."""
        if self.logged_in == False:  # noqa: E712
            return _fail("Device not logged in. Unable to add a new reminder.")
        if len(self.reminder_list) >= self.max_capacity:
            return _fail("Reminder capacity is full. Unable to add a new reminder.")
        self.reminder_id_counter += 1
        rid = self.reminder_id_counter
        self.reminder_list[rid] = {"reminder_id": rid, "title": title, "description": description, "time": time,
                                   "notified": False}  # time is kept as given, whatever its type
        return {"status": True, "message": f"Reminder '{title}' was successfully added."}

    def delete_reminder(self, reminder_id):
        """Delete by dict key (1..3 for the first three, not their reminder_id 1001..1003)."""
        if self.logged_in == False:  # noqa: E712
            return _fail("Device not logged in. Unable to delete the specified reminder.")
        if reminder_id not in self.reminder_list:
            return _fail("Reminder ID does not exist.")
        del self.reminder_list[reminder_id]
        return {"status": True, "message": f"Reminder ID {reminder_id} was successfully deleted."}

    def view_all_reminders(self):
        """Every reminder without its ids."""
        if not self.reminder_list:  # (no login check here)
            return _fail("No reminders found.")
        return {"status": True, "reminders": [{k: r[k] for k in ("title", "description", "time", "notified")}
                                              for r in self.reminder_list.values()]}


class FoodPlatform(BaseApi):
    """Users with float balances, six merchants and their menus, logged-in users, orders."""

    def __init__(self):  # BaseApi's constructor is not run
        self.users = {n: {"user_id": u, "password": p, "balance": b} for n, u, p, b in FOOD_USERS}
        self.merchant_list = {n: {"merchant_id": i, "service_type": s, "menu": [{"product": p, "price": c}
                                                                               for p, c in menu]}
                              for n, i, s, menu in MERCHANTS}
        self.logged_in_users = []
        self.orders = []
        self._console = []  # what ACEBench prints (check_balance of an unknown user); the agent never sees it

    def _load_scenario(self, scenario: dict, long_context=False) -> None:
        self.wifi = scenario.get("wifi", False)
        self.logged_in = scenario.get("logged_in", True)
        self.logged_in_users = scenario.get("logged_in_users", [])

    def login_food_platform(self, username, password):
        """Log a user into the platform (needs this app's own Wi-Fi flag)."""
        if self.wifi == False:  # noqa: E712 - this app's own flag; the device login is not checked
            return _fail("Wi-Fi is not enabled, unable to login")
        if username not in self.users:
            return _fail("User does not exist")
        if self.users[username]["password"] != password:
            return _fail("Incorrect password")
        if username in self.logged_in_users:
            return _fail(f"{username} is already logged in")
        self.logged_in_users.append(username)
        return {"status": True, "message": f"User {username} has successfully logged in!"}

    def view_logged_in_users(self):
        """Who is logged in to the platform."""
        if not self.logged_in_users:
            return _fail("No users are currently logged in to the food platform")
        return {"status": True, "logged_in_users": self.logged_in_users}

    def check_balance(self, user_name):
        """The bare float balance; an unknown user prints a line and gets 0.0."""
        if user_name in self.users:
            return self.users[user_name]["balance"]  # a bare float: the agent sees e.g. [500.0]
        self._console.append(f"User {user_name} does not exist!")
        return 0.0

    def add_food_delivery_order(self, username, merchant_name, items):
        """Order items [{product, quantity}] from one merchant; the balance pays."""
        if username not in self.logged_in_users:
            return _fail(f"User {username} is not logged in to the food platform")
        if merchant_name not in self.merchant_list:
            return _fail("Merchant does not exist")
        total, lines = 0.0, []
        for item in items:  # everything is checked before anything changes
            product, quantity = item.get("product"), item.get("quantity", 1)
            if not isinstance(quantity, int) or quantity <= 0:  # (True passes, as 1)
                return _fail(f"Invalid quantity {quantity} for product {product}")
            entry = next((p for p in self.merchant_list[merchant_name]["menu"] if p["product"] == product), None)
            if entry is None:
                return _fail(f"Product {product} does not exist in {merchant_name}'s menu")
            total += entry["price"] * quantity
            lines.append({"product": product, "quantity": quantity, "price_per_unit": entry["price"]})
        if total > self.users[username]["balance"]:
            return _fail("Insufficient balance to place the order")
        self.users[username]["balance"] -= total
        self.orders.append({"user_name": username, "merchant_name": merchant_name, "items": lines,
                            "total_price": total})
        return {"status": True, "message": f"Food delivery order successfully placed with {merchant_name}. "
                                           f"Total amount: {total} yuan"}

    def get_products(self, merchant_name):
        """A merchant's menu (a list), or an error dict."""
        merchant = self.merchant_list.get(merchant_name)
        if merchant:
            return merchant["menu"]  # a list: the agent sees its Python repr, as one string
        return _fail(f"Merchant '{merchant_name}' does not exist")

    def view_orders(self, user_name):
        """A user's orders."""
        mine = [o for o in self.orders if o["user_name"] == user_name]
        return {"status": True, "orders": mine} if mine else _fail("User has no order records")

    def search_orders(self, keyword):
        """Orders whose merchant or any product contains the keyword (case-insensitive)."""
        hits = [o for o in self.orders if keyword.lower() in o["merchant_name"].lower()  # (lowered per order)
                or any(keyword.lower() in i["product"].lower() for i in o.get("items", []))]
        return {"status": True, "orders": hits} if hits else _fail("No matching orders found")


# ---------------------------------------------------------------------------------------------------------------
# The airline


class Travel:
    """Three users, eleven flights (two numbers twice: lookups take the first), four reservations."""

    def __init__(self):
        self.users = {i: {"user_name": n, "password": p, "cash_balance": c, "bank_balance": b, "membership_level": m}
                      for i, n, p, c, b, m in TRAVELLERS}
        keys = ("flight_no", "origin", "destination", "depart_time", "arrival_time", "seats_available",
                "economy_price", "business_price")
        self.flights = [dict(zip(keys[:5], f[:5]), status="available", **dict(zip(keys[5:], f[5:]))) for f in FLIGHTS]
        self.reservations = [{"reservation_id": r, "user_id": u, "flight_no": f, "payment_method": "bank", "cabin": c,
                              "baggage": 1, "origin": o, "destination": d} for r, u, f, c, o, d in RESERVATIONS]
        self._console = []  # process_refund's console line

    def _load_scenario(self, scenario: dict, long_context=False) -> None:
        pass  # no Wi-Fi, no login

    def _first_flight(self, number, available_only=False):
        return next((f for f in self.flights if f["flight_no"] == number
                     and (not available_only or f["status"] == "available")), None)

    def _reservation(self, user_id, reservation_id):
        return next((r for r in self.reservations if r["reservation_id"] == reservation_id and r["user_id"] == user_id),
                    None)

    def get_flight_details(self, origin=None, destination=None):
        """Flights filtered by exact origin / destination (empty arguments do not filter)."""
        flights = [f for f in self.flights if (not origin or f["origin"] == origin)
                   and (not destination or f["destination"] == destination)]
        if len(flights) == 0:
            return "There are no direct flights that meet the criteria."
        return [dict(f) for f in flights]

    def get_user_details(self, user_id, password):
        """The user without the password, or an error dict with status "error"."""
        user = self.users.get(user_id)
        if user and user["password"] == password:
            return {k: v for k, v in user.items() if k != "password"}
        return {"status": "error", "message": "Incorrect username or password."}

    def get_reservation_details(self, reservation_id=None, user_id=None):
        """Reservations by id (else by user), each with the first flight of its number."""
        if reservation_id:
            found = [r for r in self.reservations if r["reservation_id"] == reservation_id]
        elif user_id:
            found = [r for r in self.reservations if r["user_id"] == user_id]
        else:
            return {"status": "error", "message": "Please provide a valid reservation ID or user ID"}
        return [{**r, "flight_info": self._first_flight(r["flight_no"])} for r in found]

    def authenticate_user(self, user_id, password):
        """Not listed in any task, but callable: the stored user, password included."""
        user = self.users.get(user_id)
        if user and user["password"] == password:
            return user  # the stored dict, password included
        return {"status": "error", "message": "Incorrect username or password."}

    def get_baggage_allowance(self, membership_level, cabin_class):
        """Free bags for a level and cabin; 0 when either is unknown."""
        return FREE_BAGS.get(membership_level, {}).get(cabin_class, 0)

    def find_transfer_flights(self, origin_city, transfer_city, destination_city):
        """Pairs of available legs via a city, the first landing before the second leaves."""
        first = [f for f in self.flights if f["origin"] == origin_city and f["destination"] == transfer_city
                 and f["status"] == "available"]
        second = [f for f in self.flights if f["origin"] == transfer_city and f["destination"] == destination_city
                  and f["status"] == "available"]
        pairs = [{"first_leg": a, "second_leg": b} for a in first for b in second
                 if datetime.strptime(a["arrival_time"], "%Y-%m-%d %H:%M:%S")
                 < datetime.strptime(b["depart_time"], "%Y-%m-%d %H:%M:%S")]
        return pairs or "No connecting flights that meet the criteria were found."

    def calculate_baggage_fee(self, membership_level, cabin_class, baggage_count):
        """50 per bag above the allowance."""
        free = FREE_BAGS[membership_level][cabin_class]  # KeyError on an unknown level or cabin
        return max(baggage_count - free, 0) * 50

    def update_balance(self, user, payment_method, amount):
        """Move money on a user dict (from the agent: a str, so TypeError)."""
        if payment_method == "cash":
            if user["cash_balance"] + amount < 0:
                return False
            user["cash_balance"] += amount
        elif payment_method == "bank":
            if user["bank_balance"] + amount < 0:
                return False
            user["bank_balance"] += amount
        return True  # any other method: True, and nothing moves

    def reserve_flight(self, user_id, password, flight_no, cabin, payment_method, baggage_count):
        """Book: ticket plus baggage fee from cash or bank; seats drop by one; id res_<count+1>."""
        user = self.authenticate_user(user_id, password)
        if not user:  # unreachable: a failed authentication is a (truthy) error dict, which fails below
            return "Authentication failed. Please check your user ID and password."
        flight = self._first_flight(flight_no, available_only=True)
        cost = flight["economy_price"] if cabin == "Economy Class" else flight["business_price"]
        cost += self.calculate_baggage_fee(user["membership_level"], cabin, baggage_count)
        if payment_method not in ["cash", "bank"]:
            return "Invalid payment method"
        balance = f"{payment_method}_balance"
        if cost > self.users.get(user_id)[balance]:
            return f"Your {payment_method} balance is insufficient. Please consider using another payment method."
        self.users.get(user_id)[balance] -= cost
        flight["seats_available"] -= 1
        rid = f"res_{len(self.reservations) + 1}"
        self.reservations.append({"reservation_id": rid, "user_id": user_id, "flight_no": flight_no,
                                  "payment_method": payment_method, "cabin": cabin, "baggage": baggage_count})
        return f"Booking successful. Reservation ID: {rid}. Total cost: {cost} yuan (including baggage fees)."

    def modify_flight(self, user_id, reservation_id, new_flight_no=None, new_cabin=None, add_baggage=0,
                      new_payment_method=None):
        """Change flight (same route), cabin (priced on the original flight) and/or add bags, paying or refunding."""
        res = self._reservation(user_id, reservation_id)
        if not res:
            return "Reservation not found or user ID does not match."
        flight = self._first_flight(res["flight_no"])
        if not flight:
            return "Flight information not found."
        pay = new_payment_method if new_payment_method else res["payment_method"]  # never stored
        user = self.users[user_id]
        if not user:
            return "User information not found."
        notes = []
        if new_flight_no and new_flight_no != res["flight_no"]:
            new = self._first_flight(new_flight_no)
            if not (new and new["origin"] == flight["origin"] and new["destination"] == flight["destination"]):
                return "Flight change failed: Invalid new flight number or destination does not match."
            res["flight_no"] = new_flight_no
            notes.append("Flight number has been changed.")
        if new_cabin and new_cabin != res.get("cabin"):
            diff = self.calculate_price_difference(flight, res["cabin"], new_cabin)  # priced on the ORIGINAL flight
            res["cabin"] = new_cabin  # set before paying: it changes even when payment fails
            if diff > 0:
                notes.append(f"Cabin change successful. Price difference paid: {diff}." if
                             self.update_balance(user, pay, -diff) else
                             "Insufficient balance to pay the cabin price difference.")
            elif diff < 0:
                self.update_balance(user, pay, -diff)
                notes.append(f"Cabin change successful. Price difference refunded: {-diff}.")
        if add_baggage > 0:
            free = self.get_baggage_allowance(user["membership_level"], res["cabin"])
            total = res.get("baggage", 0) + add_baggage
            fee = max(0, total - free) * 50  # charges again for bags already held
            if fee > 0:
                notes.append(f"Baggage has been added. Additional fee to be paid: {fee}." if
                             self.update_balance(user, pay, -fee) else
                             "Insufficient balance to pay the additional baggage fees.")
            res["baggage"] = total
        return " ".join(notes or ["Modification completed with no additional fees."])

    def cancel_reservation(self, user_id, reservation_id, reason):
        """Refund the flight's current price to cash; the reservation stays (cancelling twice refunds twice)."""
        user = self.users.get(user_id, None)
        if not user:
            return "Invalid user ID."
        res = self._reservation(user_id, reservation_id)
        if not res:
            return "Invalid reservation ID or it does not belong to the user."
        flight = self._first_flight(res["flight_no"])
        if not flight:
            return "Invalid flight information."
        depart = datetime.strptime(flight["depart_time"], "%Y-%m-%d %H:%M:%S")
        if NOW > depart:
            return "The flight segment has been used and cannot be canceled."
        price = flight["economy_price"] if res["cabin"] == "Economy Class" else flight["business_price"]
        if reason == "The airline has canceled the flight.":
            self.process_refund(user, price)
            return (f"The flight has been canceled. Your reservation will be canceled free of charge, and {price} yuan "
                    "has been refunded.")
        if depart - NOW > timedelta(days=1):
            self.process_refund(user, price)
            return f"More than 24 hours before departure. Free cancellation successful, {price} yuan has been refunded."
        fee = price * 0.1
        self.process_refund(user, price - fee)
        return (f"Less than 24 hours before departure. A cancellation fee of {fee} yuan has been deducted, and "
                f"{price - fee} yuan has been refunded.")  # the reservation itself is never removed

    def process_refund(self, user, amount):
        """Add a refund to the cash balance, and say so on the console."""
        user["cash_balance"] += amount  # to cash, however the ticket was paid
        self._console.append(f"Refund has been successfully processed. {user['user_name']}'s cash balance has been "
                             f"increased by {amount} yuan.")

    def calculate_price_difference(self, flight, old_cabin, new_cabin):
        """New cabin price minus old on `flight` (an unknown cabin costs 0)."""
        prices = {"Economy Class": flight["economy_price"], "Business Class": flight["business_price"]}
        return prices.get(new_cabin, 0) - prices.get(old_cabin, 0)


APPS = {cls.__name__: cls for cls in (BaseApi, MessageApi, ReminderApi, FoodPlatform, Travel)}
# The attributes ACEBench's loop reads for the end state, per class (others, e.g. counters and seats, are not scored)
SCORED = {"BaseApi": ["wifi", "logged_in"], "MessageApi": ["inbox"], "ReminderApi": ["reminder_list"],
          "FoodPlatform": ["users", "logged_in_users", "orders"], "Travel": ["users", "reservations"]}

if __name__ == "__main__":
    # A phone with Wi-Fi on: send one message into the full inbox (refused), delete one, send, then ask for the latest.
    phone = MessageApi()
    phone._load_scenario({"wifi": True, "logged_in": True})
    print(phone.send_message("Eve", "Frank", "hi"))
    print(phone.delete_message(3), phone.send_message("Eve", "Frank", "hi"), sep="\n")
    try:
        phone.get_latest_message_id()
    except KeyError as e:
        print("get_latest_message_id raised KeyError", e, "(message 7 has no time, as in ACEBench)")

"""The CPU demo's worlds, registered in domains.DOMAINS the way any user of muarl adds a world (domains.register).

    shop.py    a very small customer-service world, sized so a from-scratch model can learn it on a laptop CPU,
               with its lazy cold-start annotator and its scripted customer
    store.py   the shop with a customer worth simulating (it omits, changes its mind, insists, asks for a
               human): the demo's world, which its served customer model (demo/customer.py) plays

Importing this package (the demo's own modules do, as do the tests that play these worlds) adds the rows "shop" and
"store"; the core names neither. A program that runs muarl's entry points on them imports it first:
`python -m demo` trains, `python -m demo.eval` evaluates.
"""

from __future__ import annotations

import domains
from demo.worlds import shop, store


def shop_settings(c, lazy: float = 0.6) -> dict:
    """The shop's (and the store's) build arguments from the run's settings: one held-out order per test task and
    400 more for the training tasks; the annotator's lazy rate is the world's own unless the run sets one (the
    demo's --lazy_rate; -1 keeps the world's)."""
    n_test_orders = max(200, c.synthetic_test)
    lazy_rate = lazy if getattr(c, "lazy_rate", -1) == -1 else c.lazy_rate
    return dict(seed=c.synthetic_seed, n_train=c.synthetic_train, n_test=c.synthetic_test, n_orders=n_test_orders + 400,
                n_test_orders=n_test_orders, lazy_rate=lazy_rate)


def store_settings(c) -> dict:
    """The store's build arguments. Its annotator writes the default for 55 % of the customers who name the other
    option, so an imitation of its data leans one way instead of tipping either way; 8 in 10 of its allowed requests
    want the option other than the default, so no rule blind to what the customer says serves most of them.
    (docs/log.md, 2026-11-28 and 2026-12-01, measures both choices.)"""
    return shop_settings(c, lazy=0.55) | {"other_share": 0.8}


domains.register("shop", domains.Domain(shop.build_world, shop_settings, script=shop))
domains.register("store", domains.Domain(store.build_world, store_settings, script=store))

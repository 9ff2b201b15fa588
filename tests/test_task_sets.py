"""--tasks: training on tau2's train split, or on tasks generated over the retail database (held out by user)."""

import pytest

import muarl
from conftest import needs_tau2
from domains import synthetic


@needs_tau2
def test_generated_retail_tasks_hold_out_users():
    cfg = muarl.parse_config(["--model", "x", "--domains", "retail", "--tasks", "synthetic", "--user", "scripted",
                              "--synthetic_train", "60", "--synthetic_test", "20"])
    muarl.validate(cfg)  # the scripted user may play generated retail tasks
    worlds = muarl.load_worlds(cfg)
    train, held_out = muarl.task_sets(cfg, worlds)
    assert len(train) == 60 and len(held_out) == 20
    w = worlds["retail"]
    users = lambda ts: set().union(*(synthetic.task_user_ids(w, t) for t in ts))  # noqa: E731
    assert not users(train) & users(held_out)
    assert not users(train + held_out) & users(w.tasks("test"))  # nor any user of tau2's test split
    assert all(t.spec and t.expert for t in train + held_out)


def test_task_flag_errors():
    with pytest.raises(muarl.ConfigError, match="--tasks must be"):
        muarl.validate(muarl.parse_config(["--model", "x", "--tasks", "test"]))
    with pytest.raises(muarl.ConfigError, match="retail"):
        muarl.validate(muarl.parse_config(["--model", "x", "--domains", "airline", "--tasks", "synthetic", "--user", "llm"]))
    with pytest.raises(muarl.ConfigError, match="scripted user"):
        muarl.validate(muarl.parse_config(["--model", "x", "--domains", "retail"]))

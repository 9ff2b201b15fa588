"""--task_source: training on tau2's train split, or on tasks generated over the retail database (held out by user)."""

import pytest

from config import Config
from conftest import needs_tau2
from domains import load_worlds, synthetic, task_sets
from plumbing.flags import ConfigError, parse_config
from config import validate


def parse(argv):
    return parse_config(argv, Config)


@needs_tau2
def test_generated_retail_tasks_hold_out_users():
    cfg = parse(["--model", "x/y", "--domains", "retail", "--task_source", "generated", "--user", "scripted",
                 "--synthetic_train", "60", "--synthetic_test", "20"])
    validate(cfg)  # the scripted user may play generated retail tasks
    worlds = load_worlds(cfg)
    train, held_out = task_sets(cfg, worlds)
    assert len(train) == 60 and len(held_out) == 20
    w = worlds["retail"]
    users = lambda ts: set().union(*(synthetic.task_user_ids(w, t) for t in ts))  # noqa: E731
    assert not users(train) & users(held_out)
    assert not users(train + held_out) & users(w.tasks("test"))  # nor any user of tau2's test split
    assert all(t.spec and t.expert for t in train + held_out)


def test_task_flag_errors():
    with pytest.raises(ConfigError, match="--task_source must be one of train, generated, got 'test'"):
        validate(parse(["--model", "x/y", "--task_source", "test"]))
    with pytest.raises(ConfigError, match="--task_source generated: the task generator covers only .*retail"):
        validate(parse(["--model", "x/y", "--domains", "airline", "--task_source", "generated", "--user", "llm"]))
    with pytest.raises(ConfigError, match="the scripted customer plays only generated tasks"):
        validate(parse(["--model", "x/y", "--domains", "retail", "--user", "scripted"]))
    with pytest.raises(ConfigError, match="unrecognized arguments: --tasks synthetic"):  # the flag is --task_source
        parse(["--model", "x/y", "--tasks", "synthetic"])

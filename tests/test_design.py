"""The shape of the code: a teaching reference a newcomer reads in one sitting, extension points as tables.

Each test here is a claim the README makes about how muarl can be read and forked:
- the top level is the paper's concepts: the card's six files and at most four more, each opening with a
  docstring and ending with a demo (STYLE.md); what a reader may skip lives in plumbing/;
- the core (the top level, plumbing/, domains/, benchmarks/) imports nothing from demo/, at any depth, and no
  top-level file names a domain;
- the README's reading order names every top-level file (tests/test_layout.py keeps its "One GRPO
  step" table equal to the files a traced step runs);
- evaluation and a training step run conversations through the same rollout(), so on the same
  seeds they give the same episodes;
- a new domain is one file plus one row of domains.DOMAINS; an advantage estimator, a training
  reward and a customer are rows of tables, each behind a flag;
- no module imports another that imports it back;
- nothing in the project speaks of its development history.
"""

import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import grpo
import muarl
from demo import train as demo_train
from domains import BENCHES, DOMAINS, Domain, load_world, load_worlds
from eval import evaluate
from evaluation.agents import MessageAgent, OracleAgent
from plumbing.flags import ConfigError
from plumbing.hf_engine import HFEngine
from plumbing.serve import customer_for
from demo.tiny_model import build_tiny
from config import validate
from rollout import PolicyAgent, RolloutConfig, rollout, score
from user_sim import STOP, USERS, FixedUser, ScriptedUser, User, UserKind, make_user

REPO = Path(__file__).resolve().parents[1]
CARD = ("muarl", "rollout", "grpo", "user_sim", "tools", "eval")  # the product card's files
CORE = sorted(p.stem for p in REPO.glob("*.py"))  # the top level
SKIP = "plumbing"  # the folder of what a reader may skip


# --------------------------------------------------------------------------------------------------
# The top level is the paper's concepts, in the house style


def _style(path: Path) -> dict:
    src = path.read_text()
    lines = src.splitlines()
    return {"over120": [i for i, line in enumerate(lines, 1) if len(line) > 120], "demo": "__main__" in src,
            "doc": ast.get_docstring(ast.parse(src))}


def test_the_top_level_is_the_cards_files_and_at_most_four_more():
    assert set(CARD) <= set(CORE), f"the card's files missing: {set(CARD) - set(CORE)}"
    extra = sorted(set(CORE) - set(CARD))
    assert len(extra) <= 4, f"{len(extra)} top-level modules beyond the card's six (at most 4): {extra}"


@pytest.mark.parametrize("name", CORE)
def test_core_file_opens_with_a_docstring_and_runs_on_its_own(name):
    # STYLE.md: every file says what it is before its code, and `python NAME.py` shows it working; a line wider
    # than 120 columns is cut off in a side-by-side diff. How long a file is, or how much of it is comment, is a
    # smell for a reviewer to look at, not a quota: a test that counted them would reward packing lines to fit.
    s = _style(REPO / f"{name}.py")
    assert s["doc"], f"{name}.py does not open with a docstring"
    assert not s["over120"], f"{name}.py: lines wider than 120 columns: {s['over120']}"
    assert s["demo"], f"{name}.py has no __main__ demo"


def test_what_a_reader_may_skip_lives_in_one_folder_one_concept_a_file():
    # checkpoint manifests, preflight, run logging, config validation, the memory plan, the transformers KV
    # engine: none of them at the top level; each a file of plumbing/ that opens by saying what it is
    for concept in ("checkpoint", "preflight", "runlog", "validate", "memory_plan", "hf_engine"):
        assert concept not in CORE and (REPO / SKIP / f"{concept}.py").is_file(), concept
    for path in (REPO / SKIP).glob("*.py"):
        assert _style(path)["doc"], f"{path.name} does not open with a docstring saying what it is"


# --------------------------------------------------------------------------------------------------
# The README's reading path: every file it names

README = (REPO / "README.md").read_text()


def _readme_table(title: str) -> list[tuple[str, int | None]]:
    """The rows `| `file` | N | ...` of the README table under the heading `title`."""
    part = README.split(title, 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([\w/.]+)` \| ([^|]*)\|", part, flags=re.M)
    return [(f, int(n.strip().replace(",", "")) if n.strip().replace(",", "").isdigit() else None) for f, n in rows]


def test_the_readmes_reading_order_names_every_top_level_file():
    rows = _readme_table("## Reading order")
    assert len(rows) >= 10, rows
    for f, _ in rows:
        assert (REPO / f).is_file(), f"README reading order names {f}, which does not exist"
    assert {f for f, _ in rows} >= {f"{c}.py" for c in CORE}, "every top-level file is on the reading path"


# --------------------------------------------------------------------------------------------------
# The core imports nothing from demo/; no import circles

PACKAGES = ("domains", "benchmarks", "evaluation", "demo", SKIP)
MODULES = CORE + [f"{d}.{p.stem}" for d in PACKAGES for p in (REPO / d).glob("*.py") if p.stem != "__init__"] \
    + list(PACKAGES)


def _imports(module: str) -> set[str]:
    """Every project module `module` imports, at the top, inside a function or in its __main__ demo (ast, not
    execution): a demo that imports a module above its own is a circle too."""
    path = REPO / (module.replace(".", "/") + (".py" if module not in PACKAGES else "/__init__.py"))
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


GRAPH = {m: _imports(m) for m in MODULES}


def test_the_import_graph_has_no_circles():
    def visit(m, path):
        for n in sorted(GRAPH[m]):
            assert n not in path, "import circle: " + " -> ".join(path[path.index(n):] + [n])
            visit(n, path + [n])

    for m in MODULES:
        visit(m, [m])


def test_the_core_imports_nothing_from_the_demo_at_any_depth():
    core = [m for m in MODULES if not (m == "demo" or m.startswith("demo."))]
    for m in core:
        reach, todo = set(), [m]
        while todo:
            for n in GRAPH[todo.pop()] - reach:
                reach.add(n)
                todo.append(n)
        demo = sorted(n for n in reach if n == "demo" or n.startswith("demo."))
        assert not demo, f"{m} imports the demo's kit ({demo}), directly or through another module"


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module's code: not its docstrings, not its __main__ demo."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    demo = {id(x) for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)
            for x in ast.walk(n)}
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs | demo]


@pytest.mark.parametrize("name", CORE + [f"{SKIP}/{p.stem}" for p in (REPO / SKIP).glob("*.py")])
def test_no_core_file_names_a_domain(name):
    # A world is a row of domains.DOMAINS: a core file that named one would make forking a world a hunt.
    named = [(line, s) for line, s in _code_strings(REPO / f"{name}.py") if s in DOMAINS or s in BENCHES]
    assert not named, f"{name}.py names a domain: {named}"


# --------------------------------------------------------------------------------------------------
# One episode loop


@pytest.fixture(scope="module")
def shop_and_model(tmp_path_factory):
    world = load_world("shop", seed=0, n_train=20, n_test=20)
    model, tok = build_tiny(tmp_path_factory.mktemp("tiny"), texts=[world.rules] + [json.dumps(t.expert) for t in
                            world.tasks("train")], hidden=64, layers=1, heads=1, kv_heads=1, intermediate=128,
                            vocab_size=400)
    return world, model, tok


def test_evaluation_and_a_training_step_play_identical_episodes(shop_and_model):
    # eval.evaluate (k trials per task, in batches) and a training step's rollout + score (G per task) run the
    # same loop: with the same seed they sample the same conversations, token for token, and score them alike.
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
        assert all(a["end"] == b["start"] for a, b in zip(e.spans, e.spans[1:]))  # contiguous, no gap or overlap
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


# --------------------------------------------------------------------------------------------------
# Research variants: each one a table row or a function, behind a flag

CORE_RUN = ["--domains", "shop", "--user", "scripted", "--sft_epochs", "0"]


def test_no_std_advantage_is_a_row_and_a_flag():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert grpo.ADVANTAGES["no_std"](r, 4).tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert grpo.ADVANTAGES["grpo"](r, 4).tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    cfg = demo_train.parse(["--advantage", "no_std"])
    assert cfg.advantage == "no_std"
    validate(cfg, model_given=False)
    with pytest.raises(ConfigError, match="advantage"):
        validate(demo_train.parse(["--advantage", "no_such_estimator"]), model_given=False)


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
    # A fork's reward: one row of grpo.REWARDS (here: a penalty per agent turn, a turn-level shaping) and the flag
    # that picks it. Training advantages change; the episode's score, what evaluation reports, does not.
    world, model, tok = shop_and_model
    cfg = RolloutConfig(max_turns=6, max_new_tokens=16, max_context=1024, tools_in_prompt=False, seed=3)
    eps = score(rollout(world.tasks("train")[:2], 2, {"shop": world}, PolicyAgent(HFEngine(model, tok), tok),
                        ScriptedUser(), cfg), {"shop": world})
    eps[0].reward = eps[1].reward = 1.0
    eps[0].agent_turns, eps[1].agent_turns = 1, 3  # the same outcome, reached in fewer turns by the first
    monkeypatch.setitem(grpo.REWARDS, "brief", lambda e: e.reward - 0.1 * e.agent_turns)
    validate(demo_train.parse(["--reward", "brief"]), model_given=False)
    with pytest.raises(ConfigError, match="reward"):
        validate(demo_train.parse(["--reward", "nope"]), model_given=False)
    assert muarl.advantages(eps, 2)[1][:2] == [0.0, 0.0]  # the paper's outcome reward: nothing to learn here
    brief = muarl.advantages(eps, 2, reward="brief")[1][:2]
    assert brief[0] > 0 > brief[1]  # the shorter conversation is preferred
    assert [e.reward for e in eps[:2]] == [1.0, 1.0]  # the score evaluation reports is untouched


# --------------------------------------------------------------------------------------------------
# A new customer: one class and one row of USERS; a new domain: one file and one row of DOMAINS


class Parrot(User):
    """A customer who repeats the task's request whatever the agent says, then leaves (a toy simulator)."""

    label = "a parrot"

    def first_message(self, task, tools=False):
        return task.instructions

    def reply(self, task, history, phone=None, seed=None):
        return "As I said: " + task.instructions + " " + STOP


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    world = load_world("shop", seed=0, n_train=20, n_test=20)
    path = tmp_path_factory.mktemp("tiny-folder") / "model"
    build_tiny(path, texts=[world.rules], hidden=64, layers=1, heads=1, kv_heads=1, intermediate=128,
               vocab_size=400)
    return path


def _core_run(model, out, *extra) -> list[str]:
    return ["--model", str(model), "--threads", "1", "--steps", "1", "--tasks_per_step", "2", "--group_size", "2",
            "--max_new_tokens", "8", "--max_turns", "4", "--max_context", "1024", "--eval_tasks", "2",
            "--tools_in_prompt", "false", "--out_dir", str(out), *extra]


def test_a_customer_is_one_class_and_one_row(tmp_path, monkeypatch, capsys, tiny_folder):
    import eval as evaluation

    monkeypatch.setitem(USERS, "parrot", UserKind(lambda **kw: Parrot()))  # the one row
    cfg = demo_train.parse(["--domains", "shop", "--user", "parrot"])
    validate(cfg, model_given=False)  # the validation reads the table
    assert isinstance(customer_for(cfg, make_user), Parrot)
    m = evaluation.main(["--agent", "oracle", "--domains", "shop", "--eval_tasks", "3", "--eval_trials", "1",
                         "--out", str(tmp_path / "t.jsonl")])  # (the oracle meets its own fixed line)
    assert m["episodes"] == 3
    world = load_world("shop", seed=0, n_train=0, n_test=4)
    m, eps = evaluate(world.tasks("test"), {"shop": world}, MessageAgent(OracleAgent), Parrot(), RolloutConfig(),
                      progress=False)
    assert all(e.messages[1]["content"] == e.task.instructions for e in eps)  # rollout() asked it for the opening
    res = muarl.main(_core_run(tiny_folder, tmp_path / "run", "--domains", "shop", "--user", "parrot",
                               "--sft_epochs", "0"))  # and the core trains against it
    assert "GRPO (1 steps)" in res and "customer: a parrot" in capsys.readouterr().out  # the table names it


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


def test_a_toy_domain_is_one_file_and_one_registry_row(tmp_path, monkeypatch, tiny_folder):
    (tmp_path / "toy_domain.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    import toy_domain

    monkeypatch.setitem(DOMAINS, "toy", Domain(toy_domain.build_world, script=toy_domain))  # the one row
    cfg = demo_train.parse(["--domains", "toy"])
    validate(cfg, model_given=False)  # the validation knows it, the scripted customer may play it
    worlds = load_worlds(cfg)
    tasks = worlds["toy"].tasks("test")
    assert ScriptedUser().script_for(tasks[0]) is toy_domain  # (a customer built after the row reads it)
    m, _ = evaluate(tasks, worlds, MessageAgent(OracleAgent), ScriptedUser(), RolloutConfig(), progress=False)
    assert m["pass^1"] == 1.0 and m["episodes"] == 3
    # and the core trains on it: one GRPO step of a tiny model (no cold start), evaluated on the toy's test split
    out = tmp_path / "run"
    res = muarl.main(_core_run(tiny_folder, out, "--domains", "toy", "--user", "scripted", "--sft_epochs", "0"))
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in recs if r["phase"] == "grpo"] == ["grpo"] and "GRPO (1 steps)" in res


def test_a_world_is_registered_by_name_and_an_unregistered_one_is_named(monkeypatch):
    # domains.register is how a program (the demo, a forker's) adds a world; validation names a world it lacks.
    import domains

    table = dict(domains.DOMAINS)
    monkeypatch.setattr(domains, "DOMAINS", table)
    toy = Domain(lambda: None)
    domains.register("toy", toy)
    domains.register("toy", toy)  # the same world again (its module imported twice): nothing changes
    assert table["toy"] is toy
    for name, other in (("toy", Domain(lambda: None)), ("retail", toy)):
        with pytest.raises(ValueError, match=f"domain '{name}' is already registered"):
            domains.register(name, other)
    said = domains.unknown_domains(["retail", "nowhere"])
    assert "unknown domain(s) ['nowhere']" in said and "domains.register" in said
    assert domains.unknown_domains(["retail", "toy"]) is None
    with pytest.raises(ConfigError, match=r"unknown domain\(s\) \['nowhere'\]"):
        validate(demo_train.parse(["--domains", "nowhere", "--user", "llm", "--user_model", "m"]), model_given=False)


# --------------------------------------------------------------------------------------------------
# The project speaks of itself only

HISTORY = [(re.compile(r"\bSessions? \d+"), "a session number"),
           (re.compile(r"\b[Ii]ssues? #?\d+"), "an issue number"),
           (re.compile(r"(?<![\w&/-])#\d{1,4}\b(?![\w-])"), "an issue number (#N)")]
TEXT = (".py", ".md", ".txt", ".ini", ".toml", ".cfg", ".sh", ".jinja", ".yaml", ".yml")


def _tracked() -> list[Path]:
    try:
        names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the history check needs `git ls-files`")
    return [REPO / n for n in names.split() if n.endswith(TEXT) or n == ".ci/run"]


def test_nothing_speaks_of_its_development_history():
    # No "Session N", no issue numbers, no commit ids of this repository in the README, code, comments, docs or
    # tests: the README is a product page, the log in docs/ is dated.
    files = _tracked()
    commits = subprocess.run(["git", "rev-list", "--all"], cwd=REPO, capture_output=True, text=True).stdout.split()
    prefixes = {c[:7] for c in commits}
    found = []
    for path in files:
        text = path.read_text(errors="replace")
        for pattern, what in HISTORY:
            found += [f"{path.relative_to(REPO)}: {what}: {m.group()!r}" for m in pattern.finditer(text)]
        for m in re.finditer(r"\b[0-9a-f]{7,40}\b", text):
            if m.group()[:7] in prefixes and any(c.startswith(m.group()) for c in commits):
                found.append(f"{path.relative_to(REPO)}: a commit id of this repository: {m.group()!r}")
    assert not found, "\n".join(found[:20]) + (f"\n... {len(found) - 20} more" if len(found) > 20 else "")

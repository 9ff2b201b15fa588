"""BFCL-v3 multi-turn (benchmarks/bfcl.py): BFCL's own data, backends and checker, played through rollout.rollout().

The oracle (gold calls replayed turn by turn) must pass BFCL's checker on every category; a run that misses a call
must not; a local model (token path) and an OpenAI-compatible endpoint (tools API) each play tasks end to end; a
held-out function reaches the agent exactly from the turn that reveals it; a missing wheel is one line."""

import importlib.util
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HAVE_BFCL = importlib.util.find_spec("bfcl_eval") is not None
needs_bfcl = pytest.mark.skipif(not HAVE_BFCL, reason="bfcl-eval wheel not installed: "
                                "pip install --no-deps bfcl-eval==2026.3.23")

from benchmarks import bfcl  # noqa: E402
from domains import BENCHES  # noqa: E402  (importing never needs the wheel; building the world does)


@pytest.fixture(scope="module")
def world():
    from domains import load_world

    return load_world(bfcl.NAME)


def _bench_cfg(**kw):
    from rollout import RolloutConfig

    return RolloutConfig(**{**BENCHES[bfcl.NAME].rollout, **kw})


def _sample(world, per_category=8):
    # the first tasks of every category, and a few from its middle and end (ids run 0..199)
    return [t for t in world.tasks() if int(t.id.rsplit("_", 1)[1]) % (200 // per_category) == 3]


def _play(world, tasks, agent, cfg=None):
    from eval import evaluate
    from user_sim import ScriptedUser

    return evaluate(tasks, {bfcl.NAME: world}, agent, ScriptedUser(), cfg or _bench_cfg(), progress=False)


# ---------------------------------------------------------------------------------------------------------------
# Data, customer, tools


@needs_bfcl
def test_the_four_categories_have_200_tasks_each(world):
    cats = [t.raw["category"] for t in world.tasks("test")]
    assert {c: cats.count(c) for c in bfcl.CATEGORIES} == {c: 200 for c in bfcl.CATEGORIES}
    assert world.tasks("train") == world.tasks("test")  # BFCL has no training split (documented departure)


@needs_bfcl
def test_customer_says_each_turn_when_the_agent_ends_its_turn_then_stops(world):
    task = next(t for t in world.tasks() if t.id == "multi_turn_miss_func_0")
    turns = task.spec["turns"]
    assert bfcl.scripted_first_message(task.spec) == task.raw["entry"]["question"][0][0]["content"]
    history = [{"role": "user", "content": turns[0]}]
    for k in range(1, len(turns)):
        history += [{"role": "assistant", "content": "ok"}]
        history.append({"role": "user", "content": bfcl.scripted_reply(task.spec, history)})
        assert history[-1]["content"] == turns[k]
    assert bfcl.scripted_reply(task.spec, history + [{"role": "assistant", "content": "ok"}]) == bfcl.STOP
    # the held-out turn (3, empty in the data) says BFCL's sentence, with the revealed function's schema
    assert task.raw["entry"]["question"][3] == [] and turns[3].endswith("I have updated some more functions you can "
                                                                         "choose from. What about now?")
    assert json.loads(turns[3].splitlines()[0])["function"]["name"] == "sort"


@needs_bfcl
def test_a_held_out_function_is_shown_from_the_turn_that_reveals_it(world):
    task = next(t for t in world.tasks() if t.id == "multi_turn_miss_func_0")  # sort is held out until turn 3
    env = world.new_env(task)
    names = lambda n: {s["function"]["name"] for s in env.tool_schemas([{"role": "user"}] * n)}  # noqa: E731
    assert "sort" not in names(1) and "sort" not in names(3) and "sort" in names(4) and "sort" in names(5)
    assert "post_tweet" in names(1) and "cd" in names(1)  # the task's two classes
    assert "get_stock_info" not in names(1)  # no other class's


@needs_bfcl
def test_openai_schema_maps_bfcl_types_as_bfcl_does():
    doc = {"name": "f", "description": "d", "parameters": {"type": "dict", "properties": {
        "x": {"type": "float", "description": "a number."}, "t": {"type": "tuple", "description": "pair",
                                                                  "items": {"type": "integer"}},
        "o": {"type": "dict", "description": "obj", "properties": {"k": {"type": "any", "description": "?"}}}},
        "required": ["x"]}, "response": {"type": "dict"}}
    s = bfcl.openai_schema(doc)
    p = s["function"]["parameters"]
    assert s["type"] == "function" and p["type"] == "object" and doc["parameters"]["type"] == "dict"  # a copy
    assert p["properties"]["x"] == {"type": "number", "format": "float",
                                    "description": "a number. This is a float type value."}
    assert p["properties"]["t"]["type"] == "array" and p["properties"]["t"]["items"]["type"] == "integer"
    assert p["properties"]["o"]["properties"]["k"]["type"] == "string"
    assert s["function"]["response"] == {"type": "dict"}  # kept, as BFCL's OpenAI handler keeps it


@needs_bfcl
def test_env_answers_what_bfcl_shows_and_never_evaluates_model_text(world):
    task = world.tasks()[0]  # GorillaFileSystem + TwitterAPI
    env = world.new_env(task)
    assert env.call("cd", {"folder": "document"}) == '{"current_working_directory": "document"}'  # dict -> JSON
    assert env.call("mkdir", {"dir_name": "x"}) == "None"  # anything else -> str()
    assert env.call("cd", {"nope": 1}).startswith("Error during execution: ")  # a TypeError, as eval() would say
    assert env.call("get_stock_info", {"symbol": "X"}) == "Error during execution: name 'get_stock_info' is not defined"
    assert env.call("exit", {}) == "Error during execution: Function call exit is not allowed."
    assert env.call("cd", {"folder": "x"}, requestor="user").startswith("Error: Tool 'cd' not found")
    # the checker eval()s call strings: only the task's method names and identifier keys get through
    methods = env.methods
    assert bfcl.call_string({"name": "cd", "arguments": {"folder": "a'); import os; ('"}}, methods) == \
        "cd(folder=\"a'); import os; ('\")"
    assert bfcl.call_string({"name": "__import__('os').getcwd", "arguments": {}}, methods) is None
    assert bfcl.call_string({"name": "cd", "arguments": {"folder=1) or print(2": 1}}, methods) is None
    assert bfcl.call_string({"name": "print", "arguments": {}}, methods) is None


@needs_bfcl
def test_env_matches_bfcls_own_executor_on_gold_and_perturbed_calls(world):
    # Differential: every task's gold calls, each turn preceded by perturbed copies (an argument dropped, a bogus
    # one added, a value changed, an unknown name), run on BFCLEnv and through BFCL's execute_multi_turn_func_call
    # (which eval()s the call string on its own instances): every answer must be the same string.
    import copy
    import random
    import uuid

    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils as utils

    rng = random.Random(0)

    def perturb(c):
        c, r = copy.deepcopy(c), rng.random()
        args = c["arguments"]
        if r < 0.2 and args:
            args.pop(rng.choice(list(args)))
        elif r < 0.35:
            args["bogus"] = 1
        elif r < 0.6 and args:
            k = rng.choice(list(args))
            args[k] = "nonexistent" if isinstance(args[k], str) else args[k]
        elif r < 0.65:
            c["name"] = "not_a_tool"
        elif r < 0.7 and args:
            args[rng.choice(list(args))] = [1, {"x": float(rng.choice(["nan", "inf", "-inf"]))}]
        return c

    n, differ = 0, []
    for t in world.tasks():
        env, name, entry = world.new_env(t), "parity_" + uuid.uuid4().hex, t.raw["entry"]
        for turn in t.raw["gold"]:
            for c in [perturb(c) for c in turn] + turn:
                ours = env.call(c["name"], c["arguments"])
                s = f"{c['name']}({','.join(f'{k}={v!r}' for k, v in c['arguments'].items())})"
                theirs = utils.execute_multi_turn_func_call([s], entry["initial_config"], entry["involved_classes"],
                                                            name, entry["id"], "long_context" in entry["id"])[0][0]
                n += 1
                if ours != theirs:
                    differ.append((t.id, s, ours[:100], theirs[:100]))
        for key in [k for k in vars(utils) if name in k]:
            del vars(utils)[key]
    assert n > 9000 and differ == []


# ---------------------------------------------------------------------------------------------------------------
# The score: BFCL's own checker


@needs_bfcl
def test_oracle_passes_bfcls_checker_on_a_sample_of_every_category(world):
    from evaluation.agents import MessageAgent

    tasks = _sample(world)
    m, eps = _play(world, tasks, MessageAgent(bfcl.oracle))
    assert {t.raw["category"] for t in tasks} == set(bfcl.CATEGORIES) and len(tasks) == 32
    assert [e.info.get("error") for e in eps if e.reward != 1.0] == [] and m["pass^1"] == 1.0
    assert all(e.stop_reason == "user_stop" for e in eps)
    assert bfcl.summary(eps) == {c: 100.0 for c in bfcl.CATEGORIES} | {"overall": 100.0}


@needs_bfcl
def test_a_run_missing_a_call_or_a_turn_fails(world):
    from evaluation.agents import MessageAgent

    def skip_a_turn(task):  # the oracle, except that it ends the first turn with gold calls without them
        act, first = bfcl.oracle(task), next(k for k, turn in enumerate(task.raw["gold"]) if turn)

        def step(messages, tools):
            if sum(m["role"] == "user" for m in messages) - 1 == first:
                return {"content": "Done.", "tool_calls": []}
            return act(messages, tools)
        return step

    tasks = _sample(world, 4)
    _, eps = _play(world, tasks, MessageAgent(skip_a_turn))
    assert all(e.reward == 0.0 and e.stop_reason == "user_stop" for e in eps)
    _, eps = _play(world, tasks, MessageAgent(bfcl.oracle), _bench_cfg(max_turns=4))
    # a cap before the last turn: BFCL's force-terminated
    assert all(e.reward == 0.0 for e in eps if e.stop_reason == "max_turns")
    assert any(e.info.get("error_type") == "multi_turn:force_terminated" for e in eps)
    _, eps = _play(world, tasks, MessageAgent(lambda t: (lambda messages, tools: {"content": "no", "tool_calls": []})))
    assert all(e.reward == 0.0 and e.stop_reason == "user_stop" for e in eps)  # silent: every turn empty


@needs_bfcl
def test_each_check_gets_its_own_instances_unlike_a_shared_name(world):
    # The wheel keeps the checker's instances in multi_turn_utils' globals, keyed by (model name, task id): a second
    # check of a task under one name starts from the state the first one left. Measured on 100 base tasks: the gold
    # run checked right after a wrong run of the same task fails on some; official_check (a fresh name per check,
    # its instances dropped afterwards) passes every one and leaves nothing behind.
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as checker, multi_turn_utils as utils

    tasks = world.tasks()[:100]
    before = set(vars(utils))
    shared, ours = 0, 0
    for t in tasks:
        methods = world.new_env(t).methods
        gold = [[[bfcl.call_string(c, methods)] for c in turn] for turn in t.raw["gold"]]
        wrong = [turn[1:] for turn in gold]
        checker.multi_turn_checker(wrong, t.raw["ground_truth"], t.raw["entry"], "x", "shared_name")
        shared += checker.multi_turn_checker(gold, t.raw["ground_truth"], t.raw["entry"], "x", "shared_name")["valid"]
        bfcl.official_check(wrong, t)
        ours += bfcl.official_check(gold, t)["valid"]
    for k in set(vars(utils)) - before:
        if "shared_name" in k:
            del vars(utils)[k]
    assert ours == 100 and shared < 100
    assert set(vars(utils)) == before  # official_check leaves no instance behind


def _oracle_args(*flags):
    """eval.py's parsed arguments for BFCL's oracle, whose customer is BFCL's script (ScriptedUser says the task's
    turns). The parse gives --user llm by default and refuses --user with --agent oracle, so the customer is named
    here, on the parsed arguments (see test_the_oracle_runs_from_the_command_line_as_it_is)."""
    from evaluation.flags import parse_args

    a = parse_args(["--bench", bfcl.NAME, "--agent", "oracle", "--eval_trials", "1", "--out", os.devnull, *flags])
    a.user = "scripted"
    return a


@needs_bfcl
@pytest.mark.slow
def test_oracle_scores_100_on_all_800_through_the_cli(capsys):
    from eval import main

    m = main(a=_oracle_args())
    assert m[bfcl.NAME] == {c: 100.0 for c in bfcl.CATEGORIES} | {"overall": 100.0} and m["episodes"] == 800
    assert "800 tasks x 1 trials" in capsys.readouterr().out


@needs_bfcl
def test_category_filter_and_a_bad_category(capsys):
    from eval import main

    m = main(a=_oracle_args("--category", "miss_param", "--eval_tasks", "5"))
    assert m[bfcl.NAME] == {"miss_param": 100.0, "overall": 100.0} and m["episodes"] == 5
    with pytest.raises(ValueError, match="unknown BFCL category nope"):
        main(a=_oracle_args("--category", "nope"))


@needs_bfcl
def test_the_oracle_runs_from_the_command_line_as_it_is():
    from eval import main

    m = main(["--bench", bfcl.NAME, "--category", "miss_param", "--agent", "oracle", "--eval_tasks", "2",
              "--eval_trials", "1", "--out", os.devnull])
    assert m[bfcl.NAME] == {"miss_param": 100.0, "overall": 100.0} and m["episodes"] == 2


def test_missing_wheel_is_one_line_saying_how_to_get_it(tmp_path):
    code = ("import sys, runpy; sys.modules['bfcl_eval'] = None; sys.argv = ['eval.py', '--bench', "
            f"'{bfcl.NAME}', '--out', {str(tmp_path / 'run')!r}, '--agent', 'oracle']; "
            "runpy.run_path('eval.py', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "pip install --no-deps bfcl-eval==2026.3.23" in r.stderr and "Traceback" not in r.stderr
    code = code.replace("eval.py", "muarl.py").replace("'--bench'", "'--domains'").replace(", '--agent', 'oracle'", "")
    # (a model a CPU run is for: the default 8B is refused first on a machine without CUDA; the wheel is checked
    # before any model is fetched)
    code = code.replace("'--out'", "'--model', 'Qwen/Qwen3-0.6B', '--out_dir'")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "pip install --no-deps bfcl-eval==2026.3.23" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()  # stopped on a missing wheel: nothing written


# ---------------------------------------------------------------------------------------------------------------
# End to end: a tiny local model (tokens, Qwen3 <tool_call>) and a stub OpenAI endpoint (tools API)


@needs_bfcl
def test_tiny_local_model_plays_five_tasks_and_the_token_path_can_score(world, tmp_path):
    import chat
    from plumbing.hf_engine import HFEngine
    from demo.tiny_model import build_tiny
    from rollout import PolicyAgent
    from plumbing.sampling import Sample

    tasks = [t for t in _sample(world, 4) if t.raw["category"] != "long_context"][:5]
    model, tok = build_tiny(tmp_path / "tiny", texts=[t.instructions for t in tasks], hidden=64, layers=1, heads=1,
                            kv_heads=1, intermediate=128, vocab_size=400)
    cfg = _bench_cfg(max_new_tokens=16, max_context=4096, tools_in_prompt=False, max_turns=12, temperature=0.0)
    m, eps = _play(world, tasks, PolicyAgent(HFEngine(model, tok), tok), cfg)
    assert len(eps) == 5 and m["aborted"] == 0 and all(e.stop_reason for e in eps)
    assert all(e.ids and sum(e.mask) > 0 for e in eps)  # token streams with sampled (trained) tokens
    for e in eps:  # played until the customer stopped: every request was said, in order
        if e.stop_reason == "user_stop":
            said = [m["content"] for m in e.messages if m["role"] == "user"][:-1]
            assert said == e.task.spec["turns"]

    class GoldEngine:  # writes the oracle's next message as the tokens a model would sample (Qwen3 <tool_call>)
        live = {}  # an episode's token stream -> the episode, as its turn is asked for

        def generate(self, prompts, max_new_tokens, **kw):
            out = []
            for ep in (self.live[tuple(p)] for p in prompts):
                ids = chat.assistant_ids(tok, {"role": "assistant"} | bfcl.oracle(ep.task)(ep.messages, None))
                out.append(Sample(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"))
            return out

    class Agent(PolicyAgent):
        def act(self, ep, cfg):
            self.engine.live[tuple(ep.ids)] = ep
            return super().act(ep, cfg)

    m, eps = _play(world, tasks, Agent(GoldEngine(), tok), _bench_cfg(max_new_tokens=512, max_context=10 ** 6))
    assert m["pass^1"] == 1.0, [e.info for e in eps]
    for e in eps:  # the prompt shows the task's own tools (rendered by the template), a held-out one only later
        prompt = tok.decode(e.ids[: e.spans[1]["start"]])
        shown = {s["function"]["name"] for s in e.task.raw["shown"]}
        assert all(f'"name": "{n}"' in prompt for n in shown)
        assert all(f'"name": "{s["function"]["name"]}"' not in prompt for ss in e.task.raw["revealed"].values()
                   for s in ss)
        assert all(f'"name": "{n}"' not in prompt for n in world.tools if n not in shown)


class _Endpoint(BaseHTTPRequestHandler):
    """POST /v1/chat/completions: answers as the oracle would (tool calls on the wire), records the tools sent."""
    tasks, seen = {}, []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        task = self.tasks[next(m["content"] for m in body["messages"] if m["role"] == "user")]
        self.seen.append((task.id, sum(m["role"] == "user" for m in body["messages"]),
                          {t["function"]["name"] for t in body.get("tools", [])}))
        msg = bfcl.oracle(task)(body["messages"], body.get("tools"))
        calls = [{"id": f"c{i}", "type": "function", "function": {"name": c["function"]["name"], "arguments":
                 json.dumps(c["function"]["arguments"])}} for i, c in enumerate(msg["tool_calls"])]
        reply = {"id": "x", "object": "chat.completion", "created": 0, "model": "stub", "choices": [
            {"index": 0, "finish_reason": "tool_calls" if calls else "stop",
             "message": {"role": "assistant", "content": msg["content"] or None} | ({"tool_calls": calls} if calls
                                                                                 else {})}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@needs_bfcl
def test_stub_openai_endpoint_plays_five_tasks_through_the_tools_api(world):
    pytest.importorskip("openai")
    from evaluation.agents import MessageAgent, openai_act

    tasks = [t for t in world.tasks() if t.id in ("multi_turn_base_7", "multi_turn_miss_func_0",
                                                  "multi_turn_miss_param_12", "multi_turn_long_context_3",
                                                  "multi_turn_miss_func_150")]
    _Endpoint.tasks, _Endpoint.seen = {t.spec["turns"][0]: t for t in tasks}, []
    server = HTTPServer(("127.0.0.1", 0), _Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        act = openai_act("stub", f"http://127.0.0.1:{server.server_port}/v1", "EMPTY")
        m, eps = _play(world, tasks, MessageAgent(lambda task: act))
    finally:
        server.shutdown()
    assert len(eps) == 5 and m["pass^1"] == 1.0, [e.info for e in eps]
    # miss_func_0 holds `sort` out until turn 3 (the 4th request): the endpoint saw it from then on, never before
    sort_seen = {n_user: "sort" in tools for tid, n_user, tools in _Endpoint.seen if tid == "multi_turn_miss_func_0"}
    assert set(sort_seen.values()) == {False, True} and all(seen == (n >= 4) for n, seen in sort_seen.items())


@needs_bfcl
def test_muarl_trains_one_step_on_bfcl(tmp_path):
    # RL on BFCL: the reward is BFCL's checker; a 1-step tiny run goes through setup, rollouts, the update, eval
    from demo import train as demo

    results = demo.main(["--model", "tiny", "--domains", bfcl.NAME, "--steps", "1", "--tasks_per_step", "2",
                         "--group_size", "2", "--sft_epochs", "0", "--copy_warmup", "0", "--eval_tasks", "2",
                         "--max_new_tokens", "16", "--max_context", "2048", "--max_turns", "10",
                         "--out_dir", str(tmp_path / "run")])
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    steps = [r for r in log if "reward" in r and r.get("phase") != "eval"]
    assert steps and "GRPO (1 steps)" in results and results["GRPO (1 steps)"]["episodes"] == 2


# ---------------------------------------------------------------------------------------------------------------
# The tool budget: work that would hold the rollout for minutes is refused before it runs, and the
# checker never re-runs it. Wheel-free: a stand-in for MathAPI with BFCL's own code for the three methods.


class SlowMath:
    """BFCL's MathAPI.power / square_root / logarithm, as it writes them (exact, unbounded)."""

    def power(self, base: float, exponent: float):
        return {"result": base**exponent}

    def square_root(self, number: float, precision: int):
        from decimal import Decimal, getcontext

        getcontext().prec = precision
        return {"result": Decimal(number).sqrt()}

    def round_number(self, number: float, decimal_places: int = 0):
        return {"result": round(number, decimal_places)}


@pytest.mark.parametrize("name,args", [
    ("power", {"base": 3, "exponent": 20_000_000}),  # 11.8 s, computed unbounded
    ("power", {"base": 10**4000, "exponent": 100}),
    ("square_root", {"number": 2, "precision": 1_000_000}),  # 11 s, computed unbounded
    ("square_root", {"number": 2, "precision": 1e6}),
    ("round_number", {"number": 5, "decimal_places": -10**8}),
])
def test_costly_math_is_refused_before_it_runs(name, args):
    import time

    world = bfcl.BFCLWorld([], {"MathAPI": SlowMath})
    env = world.new_env()
    env.methods = dict(bfcl._methods(SlowMath()))
    t0 = time.perf_counter()
    out = env.call(name, args)
    assert time.perf_counter() - t0 < 1.0 and out.startswith("Error during execution") and "refused" in out
    assert bfcl.call_string({"name": name, "arguments": args}, env.methods) is None  # never to the checker
    # within the budget: computed, as BFCL computes it
    small = {"power": {"base": 3, "exponent": 20}, "square_root": {"number": 2, "precision": 50},
             "round_number": {"number": 5.123, "decimal_places": 2}}[name]
    assert "Error" not in env.call(name, small) and bfcl.call_string({"name": name, "arguments": small}, env.methods)


def test_oversized_arguments_are_refused():
    env = bfcl.BFCLWorld([], {"MathAPI": SlowMath}).new_env()
    env.methods = dict(bfcl._methods(SlowMath()))
    out = env.call("power", {"base": 2, "exponent": 3, "pad": "x" * 200_000})
    assert "too large" in out and bfcl.call_string({"name": "power", "arguments": {"base": 2, "pad": "x" * 200_000}},
                                                   env.methods) is None


@needs_bfcl
def test_the_real_math_api_refuses_costly_calls_within_budget(world):
    import time

    task = next(t for t in world.tasks() if "MathAPI" in t.raw["entry"]["involved_classes"])
    env = world.new_env(task)
    for name, args in [("power", {"base": 3, "exponent": 20_000_000}),
                       ("square_root", {"number": 2, "precision": 1_000_000}),
                       ("logarithm", {"value": 10, "base": 2, "precision": 10**7})]:
        t0 = time.perf_counter()
        assert "refused" in env.call(name, args) and time.perf_counter() - t0 < 1.0

"""BFCL-v3 multi-turn as a muarl world: BFCL's own tasks, backends and checker, played through rollout.rollout().

MUA-RL's table reports the Berkeley Function Calling Leaderboard's multi-turn column (Patil et al., BFCL v3) beside
tau2. A BFCL multi-turn task is a short series of user requests ("turns") to an agent that holds the tools of one to
three simulated systems (file system, math, messaging, tickets, trading, travel, vehicle, posting: eight Python
classes, each loaded with the task's initial state). Within a turn the agent calls tools step after step; a step
without a call ends the turn, and the next request comes. Four categories of 200 tasks each:

    base           every request is complete
    miss_param     one request lacks a parameter: the right move is to ask (its turn has no gold calls); the next
                   turn supplies it
    miss_func      a function the request needs is held out: the right move is to say it cannot be done; a later
                   turn reveals the function ("I have updated some more functions ...") and the agent then uses it
    long_context   as base, on backends loaded with much more state (long file listings, many messages ...)

Everything comes from the `bfcl-eval` wheel (2026.3.23, Apache-2.0), which must be installed with
`pip install --no-deps bfcl-eval==2026.3.23` (its declared dependencies are heavy and unused here). We import only
what multi-turn uses, all of it standard library plus `mpmath` (MathAPI; torch already brings it): the data files,
the eight backend classes (`eval_checker/multi_turn_eval/func_source_code`), the official checker
(`multi_turn_checker`) and two prompt constants. In muarl terms:

    Task       one BFCL entry: spec["turns"] are what the customer says, raw["gold"] the gold calls per turn
    BFCLEnv    one episode's backends: fresh instances of the task's classes, loaded with its initial_config;
               env.call(name, arguments) runs a method and answers exactly what BFCL's executor shows a model
    customer   a script (scripted_first_message / scripted_reply, played by user_sim.ScriptedUser): the next turn's
               request whenever the agent ends its turn; ###STOP### after the last one
    score      BFCL's multi_turn_checker on the calls the episode ran, per turn and step: the backends' state and
               the calls' results must match the gold run's after every turn with gold calls (BFCL's accuracy)
    BENCH      eval.py --bench bfcl_multi_turn: every call of a step runs (BFCL executes them all), accuracy per
               category and overall

Departures from BFCL's own harness (the score itself is BFCL's checker, unchanged):
1. The prompt is muarl's: tools in the OpenAI schema BFCL's OpenAI handler sends (types mapped, see
   `openai_schema`), an empty system prompt. A local model calls tools as Qwen3 `<tool_call>` (rollout.PolicyAgent),
   an endpoint through the OpenAI tools API (agents.MessageAgent).
2. A revealed function reaches the agent both ways: its schema in the customer's message (BFCL's prompting
   handlers, how BFCL runs Qwen) and in the endpoint's tool list from then on (BFCL's FC handlers).
3. BFCL stops a turn after 20 steps (and a task that was stopped before its last turn fails); here the episode's
   turn cap (`max_turns`: tool executions + customer messages, 100 in the bench) and muarl's stop reasons apply.
   An episode that ends before its last turn (cap, malformed call, full context) fails, as BFCL's force-quit does.
4. A malformed `<tool_call>` ends the episode (muarl's rule; BFCL ends the turn). Calls to a name the task's
   classes do not have answer BFCL's NameError text, and are left out of the checker's input (BFCL would `eval`
   the name; here nothing a model writes is ever evaluated as code, see `call_string`).
5. The checker keeps every instance it builds in a module-level dict keyed by the model's name and the task id,
   so two checks of one task under one name share state; each check here gets a fresh name, and its instances
   are dropped afterwards (tests/test_bfcl.py measures what happens otherwise).
6. `excluded_function` (18 entries per category) is ignored, as BFCL's own pipeline ignores it. BFCL has no
   training split: `tasks("train")` is the benchmark itself (training on it is for trying the pipeline, not for
   reporting the benchmark), and training runs muarl's rule of one call per step (RolloutConfig.all_calls off).
7. Work that would blow muarl's tool budget is refused before it runs, where BFCL would run it: arguments over
   TOOL_CHARS, and MathAPI calls whose cost grows without bound with a number (`too_costly`: power(3, 20000000)
   took 11.8 s, square_root(2, precision=10**6) 11 s, both holding Python's lock, so no deadline could stop
   them). The refusal is the call's observation ("Error during execution: ..."), and the checker never re-runs it.

Where the data comes from, and how BFCL's function docs become tool schemas and its gold call strings become tool
calls: benchmarks/bfcl_data.py.
"""

from __future__ import annotations

import copy
import json
import uuid

from benchmarks.bench import Bench
from domains.base import TOOL_CHARS, Call, Env, Task, World, _size
from tools import CALC_BITS  # the largest int result a call may ask for (bits), as tools.calculate
from benchmarks.bfcl_data import (CATEGORIES, NAME, _jsonl, _methods, backend_config, load_classes, load_tasks,
                               openai_schema, wheel_root)

STOP = "###STOP###"  # user_sim.STOP (user_sim imports domains, so this file cannot import it)
BLOCKED = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")  # BFCL refuses them before eval
DIGITS = 10_000  # the most digits of precision (square_root, logarithm) or of rounding (round_number) a call may ask
PRECISION = {"square_root": "precision", "logarithm": "precision", "round_number": "decimal_places"}


def too_costly(name, arguments) -> str | None:
    """Why running this call would blow the tool budget, known from its arguments before it runs, or None.

    MathAPI computes exactly what it is asked, in C code that holds Python's lock (a big int, Decimal, mpmath): the
    cost of power(b, e) grows with e * bits(b), of a precision or a rounding with its digits. So the rule is
    tools.calculate's: bound the result's size up front. Every other BFCL tool is linear in its (bounded) input."""
    a = arguments if isinstance(arguments, dict) else {}
    base, exp = a.get("base"), a.get("exponent")
    if name == "power" and isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base) > 1 \
            and exp * base.bit_length() > CALC_BITS:
        return f"the result would exceed {CALC_BITS:,} bits"
    key = PRECISION.get(name)
    if key and isinstance(a.get(key), (int, float)) and not abs(a[key]) <= DIGITS:  # (NaN and inf: refused too)
        return f"{key} {a[key]!r} exceeds the budget of {DIGITS:,} digits"
    return None

# ---------------------------------------------------------------------------------------------------------------
# The environment: one episode's backend instances


class BFCLEnv(Env):
    """Fresh instances of the task's classes (no SQLite: BFCL's state lives in Python objects). A call runs the
    method on them and answers what BFCL's executor shows a model: strings as they are, dicts as JSON, anything
    else as str(), an exception as "Error during execution: <message>"."""

    def __init__(self, world: "BFCLWorld"):  # (Env.__init__ builds a SQLite database: not needed here)
        self.world, self.calls, self.task, self.instances, self.methods = world, [], None, {}, {}

    def load(self, task: Task) -> None:
        stateless = backend_config()[1]  # MathAPI: no state to load
        entry, self.task = task.raw["entry"], task
        for cls in entry["involved_classes"]:  # in BFCL's order: a later class's method name wins (none collide)
            inst = self.world.classes[cls]()
            if cls not in stateless:
                inst._load_scenario(copy.deepcopy(entry["initial_config"].get(cls, {})),
                                    long_context="long_context" in entry["id"])
            self.instances[cls] = inst
            self.methods.update(_methods(inst))

    def call(self, name, arguments, requestor: str = "assistant") -> str:
        fn = self.methods.get(name) if isinstance(name, str) and requestor == "assistant" else None
        if requestor != "assistant":  # BFCL's customer has no tools
            out = f"Error: Tool '{name}' not found."
        elif name in BLOCKED:
            out = f"Error during execution: Function call {name} is not allowed."
        elif fn is None:  # what eval() of an unknown name says in BFCL
            out = f"Error during execution: name '{name}' is not defined"
        elif not isinstance(arguments, dict):
            out = f"Error during execution: arguments of {name} must be a JSON object"
        elif (word := _non_finite(list(arguments.values()))) is not None:  # JSON's NaN / Infinity: their repr
            out = f"Error during execution: name '{word}' is not defined"  # is a name BFCL's eval() cannot read
        elif (size := _size(arguments)) > TOOL_CHARS:  # muarl's size budget (departure 7)
            out = f"Error during execution: arguments of {name} too large ({size} characters, at most {TOOL_CHARS})"
        elif why := too_costly(name, arguments):  # refused before it runs (departure 7)
            out = f"Error during execution: {name} refused: {why}"
        else:
            try:  # a copy: a backend may keep or mutate what it is given, the episode's record must not change
                result = fn(**copy.deepcopy(arguments))
                out = result if type(result) is str else _as_json(result) if type(result) is dict else str(result)
            except Exception as e:  # noqa: BLE001 - every failure is an observation, as in BFCL
                out = f"Error during execution: {e}"
        err = out.startswith(("Error", '{"error"'))
        self.calls.append(Call(name, arguments, out, err, False, requestor))
        if not err:
            self.world.after_call(self)
        return out

    def tool_schemas(self, messages=None) -> list[dict]:
        """The task's tools; a held-out one from the turn that reveals it (turn k = the (k+1)-th user message)."""
        if self.task is None:
            return self.world.tool_schemas()
        n = sum(m["role"] == "user" for m in messages or [])
        return self.task.raw["shown"] + [s for k, ss in sorted(self.task.raw["revealed"].items()) if n > k for s in ss]

    def close(self) -> None:
        self.instances, self.methods = {}, {}


def _non_finite(values: list) -> str | None:
    # the first NaN / infinity in repr order, as the word its repr starts with ("nan", "inf"; "-inf" is -inf)
    for v in values:
        if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")):
            return "nan" if v != v else "inf"
        if isinstance(v, (list, dict)) and (word := _non_finite(list(v.values() if isinstance(v, dict) else v))):
            return word
    return None


def _as_json(d: dict) -> str:
    try:  # an object inside: BFCL falls back to str()
        return json.dumps(d)
    except (TypeError, ValueError):
        return str(d)


# ---------------------------------------------------------------------------------------------------------------
# Scoring: the episode's calls, per turn and step, through BFCL's checker


def call_string(call: dict, methods: dict) -> str | None:
    """A call as BFCL's decoder writes it (convert_to_function_call: name(k=repr(v),...)), or None when it names
    no method of the task's classes or has a key that is no identifier: the checker eval()s these strings, so
    only names and keys that cannot be code get through (values are repr'd JSON: literals). A call the env
    refused for its budget is None too: the checker runs what it is given, without a budget."""
    name, args = call.get("name"), call.get("arguments")
    if name not in methods or not isinstance(args, dict) or not all(str(k).isidentifier() for k in args):
        return None
    if _size(args) > TOOL_CHARS or too_costly(name, args):
        return None
    return f"{name}({','.join(f'{k}={v!r}' for k, v in args.items())})"


def episode_turns(messages: list[dict], methods: dict) -> list[list[list[str]]]:
    """turns -> steps -> call strings, from the episode's messages: a customer request opens a turn; an agent
    message opens a step with the calls that ran (as many as the tool results that follow it); steps with no
    call are dropped, as BFCL's evaluation drops them."""
    turns: list[list[list[str]]] = []
    for i, m in enumerate(messages):
        if m["role"] == "user" and STOP not in (m.get("content") or ""):
            turns.append([])
        elif m["role"] == "assistant" and m.get("tool_calls") and turns:
            ran = 0
            while i + 1 + ran < len(messages) and messages[i + 1 + ran]["role"] == "tool":
                ran += 1
            step = [call_string(c["function"], methods) for c in m["tool_calls"][:ran]]
            if step := [s for s in step if s is not None]:
                turns[-1].append(step)
    return turns


def official_check(turns: list, task: Task) -> dict:
    """BFCL's multi_turn_checker, under a name of its own (departure 5), its instances dropped afterwards."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as checker, multi_turn_utils as utils

    gt, entry = task.raw["ground_truth"], task.raw["entry"]
    if len(turns) != len(gt):  # BFCL's evaluation: a run that stopped before its last turn fails
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error_message": f"{len(turns)} turns played of {len(gt)}"}
    name = f"muarl_{uuid.uuid4().hex}"
    try:
        return checker.multi_turn_checker(turns, gt, entry, "multi_turn_" + task.raw["category"], name)
    except Exception as e:  # noqa: BLE001 - the checker's asserts: a bad episode scores 0, the run goes on
        return {"valid": False, "error_type": "checker_error", "error_message": f"{type(e).__name__}: {e}"}
    finally:
        for key in [k for k in vars(utils) if name in k]:
            del vars(utils)[key]


class BFCLWorld(World):
    """BFCL multi-turn: tasks, the eight backend classes, the union of their tools (what a local model's calls
    are parsed against), and BFCL's checker as the reward."""

    def __init__(self, tasks: list[Task], classes: dict[str, type]):  # (World.__init__ builds a SQLite template)
        self.name, self.rules, self._tasks, self.classes = NAME, "", tasks, classes
        self.tools = {n: f for cls in classes.values() for n, f in _methods(cls)}
        self.write_tools, self.user_tools, self.collections = set(), {}, []
        self._schemas = None

    def new_env(self, task: Task | None = None) -> BFCLEnv:
        env = BFCLEnv(self)
        return env if task is None else (self.init_env(env, task) or env)

    def init_env(self, env: BFCLEnv, task: Task) -> None:
        env.load(task)

    def tool_schemas(self) -> list[dict]:
        """Every class's tools (an episode shows only its task's: BFCLEnv.tool_schemas)."""
        if self._schemas is None:
            DOC_FILES = backend_config()[2]
            folder = wheel_root() / "data" / "multi_turn_func_doc"
            self._schemas = [openai_schema(d) for c in self.classes for d in _jsonl(folder / DOC_FILES[c])]
        return self._schemas

    def tasks(self, split: str = "all") -> list[Task]:
        return list(self._tasks) if split in ("all", "test", "train") else []  # departure 6: no training split

    def score(self, task, env, messages=None, check_outputs=False, stop_reason=None):
        """(1.0 iff BFCL's checker accepts the episode, info). There are no required outputs to check."""
        result = official_check(episode_turns(messages or [], env.methods), task)
        info = {"valid": result["valid"], "category": task.raw["category"], "calls": len(env.calls),
                "errors": sum(c.error for c in env.calls)}
        if not result["valid"]:
            info.update(error_type=result.get("error_type"), error=str(result.get("error_message"))[:300])
        return float(result["valid"]), info


def build_world(categories: tuple = CATEGORIES) -> BFCLWorld:
    root = wheel_root()  # first: a missing wheel is one FileNotFoundError line saying how to install it
    classes = load_classes()
    return BFCLWorld(load_tasks(root, classes, categories), classes)


# ---------------------------------------------------------------------------------------------------------------
# The customer (a script: user_sim.ScriptedUser plays it), the oracle, and the benchmark row


def scripted_first_message(spec: dict) -> str:
    return spec["turns"][0]


def scripted_reply(spec: dict, history: list[dict]) -> str:
    """The agent ended its turn: the next request (turn n = the requests said so far), or STOP after the last."""
    n = sum(m["role"] == "user" for m in history)
    return spec["turns"][n] if n < len(spec["turns"]) else STOP


def oracle(task: Task):
    """act(messages, tools) replaying the gold calls: turn k's calls one per step, then a text reply (ends the
    turn). A check of the harness: every task must pass BFCL's checker."""
    gold = task.raw["gold"]

    def act(messages, tools):
        starts = [i for i, m in enumerate(messages) if m["role"] == "user"]
        k = len(starts) - 1
        done = sum(len(m.get("tool_calls") or []) for m in messages[starts[-1]:] if m["role"] == "assistant")
        if k < len(gold) and done < len(gold[k]):
            c = copy.deepcopy(gold[k][done])
            return {"content": "", "tool_calls": [{"function": {"name": c["name"], "arguments": c["arguments"]}}]}
        return {"content": "Done." if k < len(gold) and gold[k] else "I cannot do that as asked.", "tool_calls": []}

    return act


def select(tasks: list[Task], category: str) -> list[Task]:
    """--category a,b: the tasks of those categories (empty: all)."""
    wanted = [c for c in category.split(",") if c]
    if bad := [c for c in wanted if c not in CATEGORIES]:
        raise ValueError(f"unknown BFCL category {', '.join(bad)}: choose from {', '.join(CATEGORIES)}")
    return [t for t in tasks if not wanted or t.raw["category"] in wanted]


def summary(episodes: list) -> dict:
    """Accuracy (%) per category and overall (the mean of the categories, BFCL's multi-turn overall; equal to the
    share of all tasks when every category has its 200). Aborted episodes count as failures, as in BFCL."""
    acc = {}
    for cat in CATEGORIES:
        eps = [e for e in episodes if e.task.raw["category"] == cat]
        if eps:
            acc[cat] = 100 * sum(e.reward == 1.0 for e in eps) / len(eps)
    return acc | {"overall": sum(acc.values()) / len(acc)} if acc else {}


def report(episodes: list) -> tuple[dict, str]:
    """(figures, the line eval.py prints): summary() as BENCHES rows give it."""
    acc = summary(episodes)
    return {NAME: acc}, f"{NAME} accuracy (%): " + ", ".join(f"{k} {v:.1f}" for k, v in acc.items())


BENCH = Bench(domain=NAME, summary=report, select=select, oracle=oracle,
              rollout={"all_calls": True, "max_turns": 100})


if __name__ == "__main__":
    # Replay two tasks' gold calls by hand (eval.py plays them through rollout.rollout(); importing it here would make
    # an import circle), show what the agent would see, score them with BFCL's checker; then drop the first call.
    world = build_world(("base", "miss_func"))
    for task in [world.tasks()[0], world.tasks()[200]]:
        env, messages = world.new_env(task), [{"role": "system", "content": ""}]
        print(f"== {task.id}: {len(task.raw['gold'])} turns, tools shown {len(env.tool_schemas(messages))}")
        for k, turn in enumerate(task.raw["gold"]):
            messages.append({"role": "user", "content": task.spec["turns"][k]})
            print(f"  user: {task.spec['turns'][k][:100]}")
            for c in turn:
                messages += [{"role": "assistant", "content": "", "tool_calls": [{"function": c}]},
                             {"role": "tool", "content": env.call(c["name"], c["arguments"])}]
                print(f"    {c['name']}({json.dumps(c['arguments'])}) -> {messages[-1]['content'][:80]}")
            messages.append({"role": "assistant", "content": "Done."})
        print(f"  BFCL's checker: {world.score(task, env, messages)}")
        print(f"  without the first call: {world.score(task, world.new_env(task), messages[:3] + messages[5:])[0]}")

"""ACEBench's Agent category (arXiv 2501.12851) as a muarl world: 30 multi-turn tasks with a simulated user (20 phone,
10 airline) and 20 multi-step phone tasks, with ACEBench's own protocol and scoring.

    from domains import load_world
    world = load_world("acebench_agent")          # data from $ACEBENCH_DIR or ../shared/acebench
    env = world.new_env(task)
    env.call("execute", {"message": "[turn_on_wifi()]"})
    # -> "[{'status': True, 'message': 'Wi-Fi has been turned on'}]"  (what the agent reads)

How ACEBench's conversation maps onto rollout.rollout() (AGENT.md section 4 tells the original):
- The agent speaks Python-like text, `[name(key='value'), ...]`. `parse_turn` is ACEBench's router: in multi-turn a
  message goes to the executor only if `\\[.*\\]` matches and it decodes, otherwise to the user; in multi-step every
  message is executed. An executed message is ONE call of the pseudo-tool `execute`, since ACEBench runs the whole
  message as one unit (a failing call stops a multi-turn message; an unknown name repeats the previous result).
- `ends` is ACEBench's stop rule: after message index 1, "finish conversation" in any message (list membership for
  an execution result) ends the dialogue, and 40 messages end it in any case.
- `AceAgent` shows the agent exactly the two messages ACEBench sends (system, and a user message holding the task's
  function list and the transcript), rebuilt from the episode every turn; the customer is AceCustomer
  (acebench_customer.py: user_sim.LLMUser with ACEBench's simulator prompt, carried by the task, `task.spec
  ["simulator"]`).
- `score` is ACEBench's evaluator: end-to-end accuracy (the scored attributes of the apps at the end equal the answer,
  with its quirks), and process accuracy (milestones found in order among the executed messages) beside it.

Departures (where ACEBench would run arbitrary code, we do not): ACEBench `eval`s the decoded calls. Here they are
dispatched as method calls on the apps, which gives the same results and texts for every call ACEBench's decoder
can produce from the data's syntax, except two: a keyword argument whose value is itself a call with keywords
(`x=f(y=1)`) always raises NameError for the call's first name (ACEBench would run a Python builtin of that
name); and a binary operation in an argument is evaluated only over literals, with size limits (ACEBench `eval`s
it whole). The multi-step prompts follow ACEBench's API-model path (Chinese prompts, AGENT.md section 4.2) unless
`lang="en"` (its local-model path). The o1 single-message variant is not reproduced.
"""

from __future__ import annotations

import ast
import copy
import json
import math
import operator
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.acebench_apps import APPS, SCORED
from domains.base import Call, Task, World
from tools import CALC_BITS, ParsedTurn

EXECUTE = "execute"  # the pseudo-tool: its one argument, "message", is the agent's whole text
FINISH = "finish conversation"
MAX_MESSAGES = 40  # ACEBench's max_dialog_turns: messages after the opening one
PLEASE = "Please do not ask me any questions, use the known conditions to solve the problem"
# ACEBench's multi-turn executor returns this unformatted template on any exception, then lists its characters
ERROR_CHARS = list("Error during execution: {str(e)}")
CALL_NAME = re.compile(r"\b([a-zA-Z_]\w*)\s*(?=\()")  # how ACEBench finds the method name in a call's text
GREETING = "Is there anything you need help with today?"
HOW_TO_GET = ("ACEBench Agent data not found: put ACEBench's Agent data (github.com/ACEBench/ACEBench, MIT) laid out "
              "as data/*.json, data/possible_answer/, data/prompts/ in ../shared/acebench, or set $ACEBENCH_DIR")

# ---------------------------------------------------------------------------------------------------------------
# 1. Decoding an agent message (AGENT.md 5.1): text -> [(name, {keyword: value})], or an exception


class _Unsupported(Exception):
    pass


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.BitAnd: operator.and_,
           ast.BitOr: operator.or_, ast.BitXor: operator.xor, ast.LShift: operator.lshift, ast.RShift: operator.rshift}
_UNOPS = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert, ast.Not: operator.not_}
MAX_LEN = 100_000  # the longest str, bytes, list or tuple an argument's arithmetic may build


def _too_large(op, a, b) -> bool:
    """Would a `op` b exceed the budget? Known from the operands' sizes before it is computed (tools.calculate's rule):
    a nested power or a repetition grows exponentially with the text, ((((3**64)**64)**64)**64)**64 is 1.7 billion
    bits, ('a'*99999)*9999 a gigabyte, and both run in C holding Python's lock: checking the result comes too late."""
    ints, seq = isinstance(a, int) and isinstance(b, int), (str, bytes, list, tuple)
    if op is ast.Pow:
        return ints and b > 0 and abs(a) > 1 and b * a.bit_length() > CALC_BITS
    if op is ast.LShift:
        return ints and a != 0 and a.bit_length() + b > CALC_BITS
    if op is ast.Mult and ints:
        return a.bit_length() + b.bit_length() > CALC_BITS
    if op is ast.Mult and isinstance(a, seq) != isinstance(b, seq):  # a repetition: 'ab' * 3, 3 * [0]
        n, times = (len(a), b) if isinstance(a, seq) else (len(b), a)
        return isinstance(times, int) and n * times > MAX_LEN
    if op is ast.Mod and isinstance(a, (str, bytes)):  # printf-style widths: '%0999999999d' % 1 is a gigabyte
        return b"*" in (a if isinstance(a, bytes) else a.encode()) or \
            sum(map(int, re.findall(r"\d+", a if isinstance(a, str) else a.decode("latin-1")))) > MAX_LEN
    return False


def _arith(node):
    """What eval(ast.unparse(node)) gives for a binary operation over literals; anything else is refused (ACEBench
    would eval it: a name raises NameError there, and any exception is a decode failure both ways)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_arith(e) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
        return _UNOPS[type(node.op)](_arith(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _arith(node.left), _arith(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(b, (int, float)) and abs(b) > 64:
            raise _Unsupported("exponent too large")
        if isinstance(node.op, ast.LShift) and isinstance(b, int) and b > 64:
            raise _Unsupported("shift too large")
        if _too_large(type(node.op), a, b):  # refused before it is computed, not measured after
            raise _Unsupported("result too large")
        out = _BINOPS[type(node.op)](a, b)
        if isinstance(out, (str, bytes, list, tuple)) and len(out) > MAX_LEN:
            raise _Unsupported("result too large")
        return out
    raise _Unsupported(f"{type(node).__name__} in an expression")


def _value(node):
    """One keyword value, read the way ACEBench's resolve_ast_by_type reads it (a call with keywords becomes a
    {name: {kw: value}} dict, which the executor later turns back into a call)."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp):  # ACEBench negates the operand, whatever the operator: +2 -> -2, not 1 -> -1
        if not isinstance(node.operand, ast.Constant):
            raise _Unsupported("a unary operator on a non-literal")
        return -node.operand.value
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _Unsupported("** in a dict")
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp):
        return _arith(node)
    if isinstance(node, ast.Name):
        return node.id  # a bare name is its own text: username=Eve -> 'Eve'
    if isinstance(node, ast.Call):  # without keywords: its text; with: a nested call, evaluated by the executor
        if not node.keywords:
            return ast.unparse(node)
        name, args = _call(node)
        return {name: args}
    if isinstance(node, ast.Tuple):
        return tuple(_value(e) for e in node.elts)
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value) + "[" + ast.unparse(node.slice) + "]"
    raise _Unsupported(f"Unsupported AST type: {type(node)}")


def _call(node: ast.Call) -> tuple[str, dict]:
    parts, f = [], node.func
    while isinstance(f, ast.Attribute):
        parts.append(f.attr)
        f = f.value
    if isinstance(f, ast.Name):
        parts.append(f.id)
    # positional arguments are dropped, as in ACEBench: delete_message(3) runs as delete_message()
    return ".".join(reversed(parts)), {kw.arg: _value(kw.value) for kw in node.keywords}


def _source(value) -> str:
    """A value as ACEBench writes it into the call it evals: a dict is a nested call {name: {kw: value}}."""
    if isinstance(value, dict):
        name = list(value.keys())[0]  # IndexError on {}: a decode failure, as in ACEBench
        return f"{name}(" + ", ".join(f"{k}={_source(v)}" for k, v in value[name].items()) + ")"
    return repr(value)


def call_text(name: str, args: dict) -> str:
    return f"{name}(" + ", ".join(f"{k}={_source(v)}" for k, v in args.items()) + ")"


def parse_calls(text: str) -> list[tuple[str, dict]]:
    """ACEBench's parser: one leading space dropped, brackets added, every edge [ ] ' stripped, parsed as Python.
    Raises on what it cannot read; a list element that is not a call is an error, a bare expression gives []."""
    s = text[1:] if text[0] == " " else text  # (IndexError on "": undecodable)
    s = ("" if s.startswith("[") else "[") + s + ("" if s.endswith("]") else "]")
    body = ast.parse(s.strip("[]'"), mode="eval").body
    if isinstance(body, ast.Call):
        nodes = [body]
    elif isinstance(body, (ast.Tuple, ast.List)):
        if not all(isinstance(e, ast.Call) for e in body.elts):
            raise _Unsupported("Element is not a function call")
        nodes = body.elts
    else:
        nodes = []
    return [_call(n) for n in nodes]


def decode(text: str) -> list[tuple[str, dict]]:
    """ACEBench's decoder: parse_calls, then each call in the text form its executor evals (a top-level dict
    argument that is no {name: {kw: value}} call fails there)."""
    calls = parse_calls(text)
    for name, args in calls:
        call_text(name, args)
    return calls


def decodes(text: str) -> bool:
    try:
        decode(text)
        return True
    except Exception:  # noqa: BLE001 - any failure of ACEBench's decoder means "not a call"
        return False


def routes_to_execution(text: str) -> bool:
    """ACEBench's multi-turn agent role: execution iff `\\[.*\\]` matches somewhere and the text decodes."""
    return isinstance(text, str) and re.search(r"\[.*\]", text) is not None and decodes(text)


# ---------------------------------------------------------------------------------------------------------------
# 2. The executor: one env per episode holds the apps, the process list and what each message did


def _revive(v):
    """An argument after ACEBench's repr -> eval round trip: inf / nan have no literal (NameError), a nested call
    raises NameError for its first name (see the module docstring)."""
    if isinstance(v, dict):
        name = list(v.keys())[0]
        raise NameError(f"name '{str(name).split('.')[0]}' is not defined")
    return _literal(v)


def _literal(v):
    if isinstance(v, float) and not math.isfinite(v):
        raise NameError(f"name '{'nan' if math.isnan(v) else 'inf'}' is not defined")
    if isinstance(v, complex):
        _literal(v.real), _literal(v.imag)
    if isinstance(v, (list, tuple)):
        out = [_literal(x) for x in v]
        return out if isinstance(v, list) else tuple(out)
    if isinstance(v, dict):
        return {_literal(k): _literal(x) for k, x in v.items()}
    return v


def _wire(value):
    """A tool's return value as ACEBench hands it on: str as is, dict as json.dumps (else str), anything else str;
    then json.loads where that parses (dicts come back with str keys, '500.0' -> 500.0, non-empty lists stay text)."""
    if not isinstance(value, str):
        if type(value) is dict:
            try:
                value = json.dumps(value)
            except (TypeError, ValueError):
                value = str(value)
        else:
            value = str(value)
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value


class AceEnv:
    """One episode's apps (created at the first executed message, like ACEBench's globals), the messages that reached
    the executor (the process list), and a record per message for the parity fixtures."""

    def __init__(self, world: "AceWorld", task: Task):
        self.world, self.task = world, task
        self.multi_step = task.raw["category"] == "multi_step"
        self.apps: dict | None = None
        self.registered = False  # did some execution hand its instances to the end state (AGENT.md 7)
        self.process: list[str] = []
        self.steps: list[dict] = []
        self.calls: list[Call] = []
        self.last_observation = None

    def _instances(self) -> dict:
        if self.apps is None:
            cfg = self.task.raw["task"]["initial_config"]
            self.apps = {}
            for name in self.task.raw["task"]["involved_classes"]:
                app = APPS[name]()
                app._load_scenario(copy.deepcopy(cfg.get(name, {})))  # its own config ({} in all the data) ...
                app._load_scenario(copy.deepcopy(cfg.get("BaseApi", {})))  # ... then the phone's, on every app
                self.apps[name] = app
        return self.apps

    def tool_schemas(self, messages: list[dict] | None = None) -> list[dict]:
        return self.world.tool_schemas()  # the episode's tools are the world's (base.Env.tool_schemas' contract)

    def call(self, name, arguments, requestor: str = "assistant") -> str:
        """rollout's tool interface: only `execute` exists; it returns the execution message as the agent reads it."""
        if name != EXECUTE or requestor != "assistant" or not isinstance(arguments, dict) \
                or set(arguments) != {"message"} or not isinstance(arguments["message"], str):
            out = f"Error: the only tool is {EXECUTE}(message: str), the agent's whole message"
            self.calls.append(Call(str(name), arguments, out, True, False, requestor))
            return out
        return str(self.execute(arguments["message"]))

    def execute(self, message: str):
        """Run one agent message as ACEBench's executor does; returns the execution message (a list, or PLEASE)."""
        self.process.append(message)
        step = {"message": message, "calls": []}
        self.steps.append(step)
        try:
            calls = None
            calls = parse_calls(message)
            decode(message)
        except Exception:  # noqa: BLE001 - undecodable: multi-step answers PLEASE; multi-turn never routes it here
            step.update(decoded=None if calls is None else [{n: a} for n, a in calls], instance="dict",
                        observation=PLEASE if self.multi_step else ERROR_CHARS)
            step["calls"] = [{"name": n, "arguments": a, "executed": False} for n, a in calls or []]
            self.last_observation = step["observation"]
            return self.last_observation
        step["decoded"] = [{n: a} for n, a in calls]
        apps, results, last = self._instances(), [], None
        methods: dict[str, list[str]] = {}
        for cls, app in apps.items():  # every public method of every involved app; shared names run on each
            for attr in dir(app):
                if not attr.startswith("_") and callable(getattr(app, attr)):
                    methods.setdefault(attr, []).append(cls)
        failed = False
        for name, args in calls:
            rec = {"name": name, "arguments": args, "executed": not failed}
            step["calls"].append(rec)
            if failed:
                continue
            m = CALL_NAME.search(call_text(name, args))
            targets = methods.get(m.group(1), []) if m else []
            rec.update(found=bool(targets), dispatched_to=[], raised=False, error=None)
            try:
                compile(call_text(name, args), "<string>", "eval")  # what ACEBench evals must at least parse
                if targets and (m.start() != 0 or m.group(1) != name):  # a dotted name: its first part is unknown
                    raise NameError(f"name '{name.split('.')[0]}' is not defined")
                for cls in targets:
                    rec["dispatched_to"].append(cls)
                    kwargs = {k: _revive(v) for k, v in args.items()}
                    last = ("ok", getattr(apps[cls], m.group(1))(**kwargs))
                rec["return"] = last[1] if targets else None
            except Exception as e:  # noqa: BLE001 - a failing tool is an observation, as in ACEBench
                rec.update(raised=True, error=f"{type(e).__name__}: {e}", **{"return": None})
                last_error = e
            else:
                last_error = None if last is not None else UnboundLocalError(  # no tool ran in this message yet
                    "cannot access local variable 'func_call_result' where it is not associated with a value")
            # an unknown name runs nothing and repeats the previous result (ACEBench's stale local variable)
            if last_error is None:
                results.append(last[1])
            elif not self.multi_step:  # multi-turn: the message stops here; its earlier effects stay
                failed = True
            else:
                results.append(f"Error during execution: {last_error}")
            said = str(rec.get("error") or rec.get("return"))
            self.calls.append(Call(name, args, said, last_error is not None, False))
        if failed:
            step.update(observation=ERROR_CHARS, instance="list")
        else:
            self.registered = True
            step.update(observation=[_wire(r) for r in results], instance="dict")
        self.last_observation = step["observation"]
        return self.last_observation

    def console(self) -> list[str]:
        return [line for app in (self.apps or {}).values() for line in getattr(app, "_console", [])]

    def end_state(self) -> list[dict]:
        """The `result` ACEBench's evaluator reads: per app, its scored attributes in the instance's own order,
        after a JSON round trip (int keys become strings); [] when no execution ever registered the apps."""
        if not self.registered:
            return []
        out = [{name: {k: v for k, v in vars(app).items() if k in SCORED[name]}} for name, app in self.apps.items()]
        return json.loads(json.dumps(out, ensure_ascii=False, default=str))

    def close(self) -> None:
        pass  # nothing to release: the apps are plain objects


# ---------------------------------------------------------------------------------------------------------------
# 3. ACEBench's evaluator (eval_main.agent_eval, checker.agent_checker)


def _check_app(result: dict, answer: dict) -> dict:
    cls, expected, got = list(answer)[0], list(answer.values())[0], list(result.values())[0]
    errors = []
    for attr, value in got.items():  # walks the RESULT's attributes; a dict answer checks only its own keys
        if attr not in expected:
            errors.append(f"class({cls}) attributes({attr}) missing in possible_answer.")
            continue
        want = expected[attr]
        if isinstance(want, dict):
            for key, v in want.items():
                if key not in value:
                    errors.append(f"class({cls}) attributes({attr}) wrong, [expected: {want}, real: {value}]")
                elif v != value[key]:
                    errors.append(f"class({cls}) attributes({attr}.{key}) wrong, [expected: {v}, real: {value[key]}]")
        elif want != value:
            errors.append(f"class({cls}) attributes({attr}) wrong, [expected: {want}, real: {value}]")
    return {"valid": not errors, "error": errors, "error_type": "class attributes wrong"}


def check_end_state(result: list[dict], truth: list[dict]) -> dict:
    """One task's end-to-end verdict, with ACEBench's quirks: a length check, then each answer entry against the first
    result entry with the same class name; an entry that matches none (a misspelled class) repeats the last verdict."""
    if len(truth) != len(result):
        return {"valid": False, "error_type": "wrong number of class", "errors": []}
    verdict, errors, etype = {"valid": True}, [], None
    for entry in truth:
        match = next((r for r in result if set(r) == set(entry)), None)
        if match:
            verdict = _check_app(match, entry)
        if not verdict["valid"]:
            errors.append(verdict["error"])
            etype = verdict["error_type"]
    return {"valid": not errors, "error_type": etype, "errors": errors}


def _path_score(process: list[str], path: list[str]) -> float:
    i, hits = 0, 0
    for stone in path:  # greedy, in order, exact after strip(); after a miss the cursor is at the end
        while i < len(process):
            i += 1
            if process[i - 1].strip() == stone.strip():
                hits += 1
                break
    return hits / len(path) if path else 1.0


def process_accuracy(process: list[str], milestones: list, passed: bool) -> float:
    """1.0 for a task that passed; else the milestone share (alternative paths: the best, each rounded to 3)."""
    if passed:
        return 1.0
    if isinstance(milestones[0], list):
        return max(round(_path_score(process, p), 3) for p in milestones)
    return _path_score(process, milestones)


# ---------------------------------------------------------------------------------------------------------------
# 4. The world: tasks, prompts, the router and stop rule, the reward


DEFAULT_DIR = Path(__file__).resolve().parents[2] / "shared" / "acebench"  # ../shared/acebench beside the repo


def find_data(data_dir=None) -> Path:
    """The ACEBench folder: `data_dir`, else $ACEBENCH_DIR, else ../shared/acebench; missing: one clear line."""
    d = Path(data_dir or os.environ.get("ACEBENCH_DIR") or DEFAULT_DIR)
    if (d / "data" / "data_agent_multi_turn.json").is_file():
        return d
    raise FileNotFoundError(f"{HOW_TO_GET} (looked in {d})")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class AceWorld(World):
    """The 50 tasks and ACEBench's protocol. Not a SQLite world: the apps are Python objects, built per episode."""

    def __init__(self, root: Path):
        self.name, self.write_tools, self.user_tools, self._gold_cache = "acebench_agent", set(), {}, {}
        self.prompts = {p.stem: p.read_text(encoding="utf-8") for p in (root / "data" / "prompts").glob("*.txt")}
        self.tools = {EXECUTE: None}
        tasks, self._specs = [], {}
        for cat in ("multi_turn", "multi_step"):
            answers = {a["id"]: a for a in _lines(root / "data" / "possible_answer" / f"data_agent_{cat}.json")}
            for t in _lines(root / "data" / f"data_agent_{cat}.json"):
                tasks.append(self._task(cat, t, answers[t["id"]]))
                self._specs.update({f["name"]: f for f in t["function"]})
        self._tasks = tasks
        # training shows one system prompt for every task (rollout's rules are per world): the multi-turn text with
        # both domains' rules; evaluation (AceAgent) shows each task ACEBench's own prompt instead.
        p = self.prompts
        self.rules = (p["multi_turn_agent_system_en"] + p["multi_turn_agent_phone_rules_en"] + "\n"
                      + p["multi_turn_agent_travel_rules_en"])

    def _task(self, cat: str, t: dict, answer: dict) -> Task:
        phone = "BaseApi" in t["involved_classes"]
        if cat == "multi_turn":  # the customer: ACEBench's simulator prompt, greeting, roles and sampling, verbatim
            sim = {"system": self.prompts["user_simulator_phone_en" if phone else "user_simulator_travel_en"].format(
                instruction=t["question"]), "greeting": GREETING, "own_role": "system", "strip": ["user:", "agent:"],
                "sampling": {"temperature": 0.001, "top_p": 1, "max_tokens": 1000}}
        else:  # no customer: the question is the first message and nobody answers after it
            sim = {"opening": t["question"]}
        return Task(id=f"acebench/{t['id']}", domain="acebench_agent", split="test", instructions=t["question"],
                    actions=[], spec={"world": "acebench_agent", "simulator": sim},
                    raw={"category": cat, "task": t, "answer": answer})

    def tasks(self, split: str = "all") -> list[Task]:
        """ACEBench has one set of tasks: every split is all 50 (training on it trains on the benchmark)."""
        return list(self._tasks)

    def new_env(self, task: Task | None = None) -> AceEnv:
        if task is None:
            raise ValueError("an ACEBench env needs its task (the apps and initial state depend on it)")
        return AceEnv(self, task)

    def tool_schemas(self) -> list[dict]:
        """For a policy trained through the chat template: the union of the tasks' functions, as OpenAI schemas."""
        return [{"type": "function", "function": {"name": f["name"], "description": f["description"], "parameters":
                 dict(f["parameters"], type="object")}} for f in self._specs.values()]

    def parse_turn(self, env: AceEnv, text: str) -> ParsedTurn:
        """ACEBench's router: the whole message to the executor (one `execute` call), or to the user (no call)."""
        if env.multi_step or routes_to_execution(text):
            return ParsedTurn(content=text, calls=[{"name": EXECUTE, "arguments": {"message": text}}])
        return ParsedTurn(content=text)

    def ends(self, ep) -> str | None:
        """ACEBench's stop rule, checked after every new message (the newest is ep.messages[-1])."""
        index = len(ep.messages) - 3  # its loop's index: the system prompt and the opening message come before
        last = ep.messages[-1]
        said = ep.env.last_observation if last["role"] == "tool" else last.get("content") or ""
        if index > 1 and isinstance(said, (str, list)) and FINISH in said:
            return "user_stop" if last["role"] == "user" else "finished"
        return "max_turns" if index >= MAX_MESSAGES - 1 else None

    def score(self, task: Task, env: AceEnv, messages=None, check_outputs: bool = False, stop_reason=None):
        """Reward 1 iff ACEBench's end-to-end check passes; info carries process accuracy and the errors."""
        state = env.end_state()
        verdict = check_end_state(state, task.raw["answer"]["ground_truth"])
        proc = process_accuracy(env.process, task.raw["answer"]["mile_stone"], verdict["valid"])
        info = {"category": task.raw["category"], "end_to_end": float(verdict["valid"]), "process_accuracy": proc,
                "error_type": verdict["error_type"], "errors": verdict["errors"], "process": list(env.process),
                "calls": len(env.calls), "errors_in_calls": sum(c.error for c in env.calls)}
        return float(verdict["valid"]), info

    # --- what the agent sees (AGENT.md 4.1 / 4.2) ------------------------------------------------------------

    def history(self, task: Task, messages: list[dict]) -> str:
        """ACEBench's transcript: every message in multi-turn; in multi-step only the question and the results."""
        multi_step, out = task.raw["category"] == "multi_step", ""
        for m in messages:
            if m["role"] == "user":
                out += "user:" + m["content"] + "\n"
            elif m["role"] == "assistant" and not multi_step:
                out += "agent:" + m["content"] + "\n"
            elif m["role"] == "tool":
                out += ("execution result:" if multi_step else "execution:") + m["content"] + "\n"
        return out

    def agent_messages(self, task: Task, messages: list[dict], lang: str = "zh") -> list[dict]:
        """The two messages ACEBench sends the agent model for its next turn."""
        t, p, hist = task.raw["task"], self.prompts, self.history(task, messages)
        if task.raw["category"] == "multi_step":
            system, user = p[f"multi_step_agent_system_{lang}"], p[f"multi_step_agent_user_{lang}"]
        else:
            system, user = p["multi_turn_agent_system_en"], p["multi_turn_agent_user_en"]
            system += p["multi_turn_agent_travel_rules_en"] if "Travel" in t["involved_classes"] else ""
            system += p["multi_turn_agent_phone_rules_en"] if "BaseApi" in t["involved_classes"] else ""
        return [{"role": "system", "content": system},
                {"role": "user", "content": user.format(functions=str(t["function"]), history=hist)}]


def build_world(data_dir=None) -> AceWorld:
    return AceWorld(find_data(data_dir))


# ---------------------------------------------------------------------------------------------------------------
# 5. The scripted customer (a stand-in so --user scripted runs; ACEBench's customer is acebench_customer.AceCustomer)


def scripted_first_message(spec: dict) -> str:
    sim = spec["simulator"]
    return sim.get("opening") or "Hi, I need some help."


def scripted_reply(spec: dict, history: list[dict]) -> str:
    return FINISH  # the stand-in has nothing more to say: ACEBench's end marker


if __name__ == "__main__":
    # Multi-turn task 0's answer path through the executor, then the score ACEBench would give; then the end of the
    # prompt the agent would see first.
    world = build_world()
    task = world.tasks()[0]
    env = world.new_env(task)
    for message in task.raw["answer"]["mile_stone"]:
        print(message, "->", env.call(EXECUTE, {"message": message}))
    print("reward", world.score(task, env)[0])
    print(world.agent_messages(task, [{"role": "user", "content": "Hi"}])[1]["content"][-60:])

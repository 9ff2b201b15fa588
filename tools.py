"""Tools, as the policy sees them: two halves of one contract with the model.

1. Out: `function_schema(fn)` turns a tool's Python signature and Google-style docstring into the
   OpenAI function schema that chat templates (Qwen3's included) render into the system prompt. The
   schema is never written by hand, so the tool the model is told about is always the tool that
   runs.
2. In: `parse_tool_calls(text)` finds the Qwen3/Hermes calls in a sampled turn,

       <tool_call>
       {"name": "get_order_details", "arguments": {"order_id": "#W2378156"}}
       </tool_call>

   and says exactly what is wrong with each malformed one. Turning those verdicts into an
   observation for the agent, or into the end of the episode, is rollout.py's job (configurable
   there).

It also holds the three generic tools every domain offers: `think`, `calculate`,
`transfer_to_human_agents` (tau2 ships the last two in retail and airline; MUA-RL tracks how often
all three are called).

Departures: none from the paper. `think` is not a tau2 tool (it changes nothing; see its docstring).
"""

from __future__ import annotations

import ast
import inspect
import json
import operator
import re
import types
from dataclasses import dataclass, field
from typing import Any, Callable, List, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

# --------------------------------------------------------------------------------------------------
# 1. Schemas from signatures

HEADER = re.compile(r"(Args|Arguments|Parameters|Attributes|Returns|Raises|Yields|Example|Examples|Note):")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Google-style docstring -> (description, {argument: description}).

    The description is everything before the first section header (Args:, Returns:, Raises:, ...);
    under "Args:" each `name: text` line starts an argument and more-indented lines continue it."""
    desc, args, section, current = [], {}, None, None
    for line in inspect.cleandoc(doc or "").splitlines():
        stripped = line.strip()
        if header := HEADER.fullmatch(stripped):
            section, current = header.group(1), None
        elif section is None:
            desc.append(line)
        elif section in ("Args", "Arguments", "Parameters", "Attributes"):
            m = re.match(r"^\s{0,4}(\w+)\s*(\([^)]*\))?:\s*(.*)$", line)
            if m and not line.startswith(" " * 8):
                current = m.group(1)
                args[current] = m.group(3).strip()
            elif current and stripped:
                args[current] = (args[current] + " " + stripped).strip()
    return "\n".join(desc).strip(), args


def _with_doc(schema: dict, doc: str | None) -> dict:
    # The argument's docstring line becomes its "description", after the type: the key order tau2's schemas have.
    return schema if doc is None else schema | {"description": doc}


def type_schema(tp: Any) -> dict:
    """JSON schema of a Python type hint: str, int, float, bool, list[X], dict, Literal[...],
    TypedDicts."""
    origin, args = get_origin(tp), get_args(tp)
    # exact types: bool is not int here
    scalars = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if tp in scalars:
        return {"type": scalars[tp]}
    if tp is Any:
        return {}
    if origin is Literal:
        return {"type": "string" if all(isinstance(a, str) for a in args) else "number", "enum": list(args)}
    if origin in (list, tuple, List):
        return {"type": "array", "items": type_schema(args[0]) if args else {}}
    if origin in (Union, types.UnionType):  # Optional[X] is Union[X, None]
        rest = [a for a in args if a is not type(None)]
        return type_schema(rest[0]) if len(rest) == 1 else {"anyOf": [type_schema(a) for a in rest]}
    if tp is dict or origin is dict:
        return {"type": "object"}
    if is_typeddict(tp):
        hints, (_, docs) = get_type_hints(tp), parse_docstring(tp.__doc__)
        props = {k: _with_doc(type_schema(v), docs.get(k)) for k, v in hints.items()}
        return {"type": "object", "properties": props, "required": [k for k in hints if k in tp.__required_keys__]}
    raise TypeError(f"no JSON schema for type {tp!r}")


def function_schema(fn: Callable, skip_first: bool = True) -> dict:
    """OpenAI function schema of a tool. Domain tools take the database first (`db`), which the
    model never sees."""
    hints, (desc, arg_docs) = get_type_hints(fn), parse_docstring(fn.__doc__)
    params = list(inspect.signature(fn).parameters.values())[1 if skip_first else 0 :]
    props = {p.name: _with_doc(type_schema(hints.get(p.name, Any)), arg_docs.get(p.name)) for p in params}
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    parameters = {"type": "object", "properties": props, "required": required}
    return {"type": "function", "function": {"name": fn.__name__, "description": desc, "parameters": parameters}}


# --------------------------------------------------------------------------------------------------
# 2. Generic tools (the first argument is the database, unused here, so they sit beside domain tools)


def think(db: Any, thought: str) -> str:
    """Use this tool to think. It does not obtain new information or change the database; it only
    records the thought.

    Args:
        thought: A thought to think about.
    """
    return "Your thought has been noted."


def calculate(db: Any, expression: str) -> str:
    """Calculate the result of a mathematical expression.

    Args:
        expression: The mathematical expression to calculate, such as '2 + 2'. The expression can
        contain
            numbers, operators (+, -, *, /), parentheses, and spaces.

    Returns:
        The result of the expression, rounded to 2 decimal places.
    """
    # tau2's behaviour: a character whitelist, then the arithmetic, then round(float(x), 2) as text.
    # The whitelist leaves no names, attribute access or calls to a builtin. We walk the syntax tree
    # instead of eval(), so that an int result past CALC_BITS (9**9**8: 136M bits, minutes of CPU)
    # fails at once with the error tau2 reaches only at float() after those minutes; every answer
    # below that size is tau2's, bit for bit.
    if not isinstance(expression, str) or not all(ch in "0123456789+-*/(). " for ch in expression):
        raise ValueError("Invalid characters in expression")
    return str(round(float(_arith(compile(expression, "<string>", "eval", ast.PyCF_ONLY_AST).body)), 2))


# the largest int an intermediate result may hold (float() refuses > 1,024 bits anyway)
CALC_BITS = 100_000
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.UAdd: operator.pos, ast.USub: operator.neg}


def _arith(node):
    """What eval() would compute from the whitelisted characters, with a bound on int sizes."""
    if isinstance(node, ast.Constant):  # a number, or `...` (Ellipsis), which float() then refuses as eval's would
        return node.value
    if isinstance(node, ast.UnaryOp):
        return _OPS[type(node.op)](_arith(node.operand))
    if isinstance(node, ast.BinOp):
        a, b = _arith(node.left), _arith(node.right)
        if type(a) is int and type(b) is int and (  # the result's bits, known before it is computed
                a.bit_length() + b.bit_length() > CALC_BITS if isinstance(node.op, ast.Mult) else
                isinstance(node.op, ast.Pow) and b > 0 and abs(a) > 1 and b * a.bit_length() > CALC_BITS):
            raise OverflowError("int too large to convert to float")
        return _OPS[type(node.op)](a, b)
    if isinstance(node, ast.Tuple):  # "()" is the only tuple the whitelist can write
        return tuple(_arith(e) for e in node.elts)
    if isinstance(node, ast.Call):  # "(1)(2)": calling a number fails exactly as in eval
        return _arith(node.func)(*[_arith(a) for a in node.args])
    raise ValueError("Invalid expression")


def transfer_to_human_agents(db: Any, summary: str) -> str:
    """Transfer the user to a human agent, with a summary of the user's issue.

    Only transfer if
     - the user explicitly asks for a human agent
     - given the policy and the available tools, you cannot solve the user's issue.

    Args:
        summary: A summary of the user's issue.
    """
    return "Transfer successful"


GENERIC_TOOLS = [think, calculate, transfer_to_human_agents]
TRANSFER_TOOL = "transfer_to_human_agents"

# --------------------------------------------------------------------------------------------------
# 3. Parsing calls out of a sampled turn

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ParsedTurn:
    content: str  # the text outside <tool_call> blocks, stripped
    # well-formed calls, in order: {"name", "arguments"}
    calls: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one message per malformed block, in order


def clean(text):
    """Text every tokenizer and JSON writer can carry: a lone surrogate (a tool or a customer
    echoing the JSON escape "\\ud800") becomes its escape again, as text; any other string comes
    back unchanged, and a non-string as it is."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(text, str) else text


# Special-token look-alikes: <|...|> (ChatML, Qwen, Llama 3, Phi), <｜...｜> (DeepSeek), <s> </s> [INST] (Llama 2)
_MARKERS = re.compile(r"<(?=[|｜]|/?s>)|\[(?=/?INST\])")


def as_text(text):
    """`text` with each special-token look-alike broken by a zero-width space after its first
    character: no server's tokenizer reads it as a live marker (the policy could forge a system turn
    in the customer's prompt), and the text still reads the same, unlike an escape. (Our own
    tokenizer's path is stricter: chat.py sets such contents aside.)"""
    return _MARKERS.sub(lambda m: m.group() + "\u200b", text) if isinstance(text, str) else text


def check_call(obj, known: set[str] | None) -> dict | str:
    """One decoded call -> {"name", "arguments"}, or what is wrong with it. The one check every
    agent's calls pass:
    the <tool_call> text below, and an endpoint's native tool calls (agents.MessageAgent)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return 'a tool call must be a JSON object with a string "name" and an object "arguments"'
    args = obj.get("arguments", {})
    # some models put the arguments in a JSON string; accept it when it parses
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return f'the "arguments" of {clean(obj["name"])} are a string that is not JSON'
    if not isinstance(args, dict):
        return f'the "arguments" of {clean(obj["name"])} must be a JSON object'
    if known is not None and obj["name"] not in known:
        return f"unknown tool {clean(obj['name'])!r}; available: {', '.join(sorted(known))}"
    return {"name": obj["name"], "arguments": args}


def _parse_one(body: str, known: set[str] | None) -> dict | str:
    """The call, or what is wrong with it."""
    # json.loads raises ValueError on bad JSON and on an int of more than 4,300 digits, RecursionError on nesting
    # past the stack: each is the turn's parse error, never an exception that escapes the rollout.
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as e:
        return f"the tool call is not valid JSON ({getattr(e, 'msg', type(e).__name__)} at {getattr(e, 'pos', 0)})"
    return check_call(obj, known)


def parse_tool_calls(text: str, known_tools: set[str] | None = None) -> ParsedTurn:
    """Split a sampled assistant turn into its text and its tool calls.

    Each <tool_call> block is parsed on its own: bad JSON, a missing name, arguments that are not an
    object, an unknown tool (if `known_tools` is given) or no closing tag (a turn cut off mid-call)
    gives an error, not a call."""
    calls, errors, content, pos = [], [], [], 0
    # Block after block; when no call is left (the loop's else), the rest is text. A cut-off call breaks out
    # of the loop instead, and its text is dropped.
    while (i := text.find(CALL_OPEN, pos)) >= 0:
        content.append(text[pos:i])
        if (j := text.find(CALL_CLOSE, i)) < 0:
            errors.append("a <tool_call> block was opened but never closed")
            break
        call = _parse_one(text[i + len(CALL_OPEN) : j].strip(), known_tools)
        (calls if isinstance(call, dict) else errors).append(call)
        pos = j + len(CALL_CLOSE)
    else:
        content.append(text[pos:])
    return ParsedTurn("".join(content).strip(), calls, errors)


def check_arguments(fn: Callable, arguments: dict) -> str | None:
    """A clear message if `arguments` cannot bind to the tool's signature (missing or unexpected
    names), else None.

    Types are not checked here on purpose: tau2 passes arguments through unchanged, and its tools'
    reactions to a wrong type (a numeric zip code that never matches, a float amount stored as int)
    are part of what we copy."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    missing = [p.name for p in params if p.name not in arguments and p.default is inspect.Parameter.empty]
    extra = [a for a in arguments if a not in {p.name for p in params}]
    parts = [f"{what} {', '.join(names)}" for what, names in (("missing", missing), ("unexpected", extra)) if names]
    return f"Error: bad arguments for {fn.__name__}: " + "; ".join(parts) if parts else None


if __name__ == "__main__":
    print(json.dumps(function_schema(calculate), indent=2))
    turn = 'Let me check.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 * (3 + 4)"}}\n</tool_call>'
    print(parsed := parse_tool_calls(turn, {"calculate"}))
    print("result:", calculate(None, **parsed.calls[0]["arguments"]))
    print(parse_tool_calls('<tool_call>{"name": "calculate", "arguments": {"expression": }</tool_call>'))

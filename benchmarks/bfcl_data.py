"""BFCL multi-turn's data, from the bfcl-eval wheel: tasks, gold calls, and tool schemas in the OpenAI format.

The wheel (2026.3.23) ships BFCL's data as JSON lines under `bfcl_eval/data/`: one file per category
(`BFCL_v4_multi_turn_<category>.json`: the wheel is BFCL v4, whose multi-turn categories are those BFCL v3
introduced), the gold answers beside them (`possible_answer/`), and one file of function docs per backend class
(`multi_turn_func_doc/`). A task's tools are its classes' docs in order, minus the held-out ones (miss_func), as
BFCL's populate_test_cases_with_predefined_functions builds them. Two conversions make them muarl's:

    openai_schema   a BFCL doc (types dict, float, tuple, any ...) -> the OpenAI tool schema BFCL's OpenAI handler
                    sends (its convert_to_tool, copied: model_handler/utils.py imports tenacity)
    _gold_call      a gold call string, e.g. "sort('final_report.pdf')" -> {"name": "sort", "arguments":
                    {"file_name": "final_report.pdf"}}: positional arguments named from the method's signature, so an
                    agent can replay it as a tool call (benchmarks/bfcl.py's oracle)

Which data: the pinned wheel's files are BFCL v4's revision of the v3 multi-turn set, not the v3-era files byte for
byte. Measured against bfcl-eval 2025.6.8 (files still named BFCL_v3_): per category of 200, 71-73 questions,
72-75 initial configs and 67-70 gold answers differ, 18 tasks gained `excluded_function`, 11 miss_func tasks changed
`missed_function`; 6 of the 8 function-doc files and 7 of the 8 backend modules (not MathAPI's) differ;
multi_turn_checker.py is identical. `backend_config` reads both layouts, so
`pip install --no-deps bfcl-eval==2025.6.8` runs the older set (the oracle scores 100 % on both).

Departures: none; this file only reads. A missing wheel is one FileNotFoundError line saying how to install it.
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
from pathlib import Path

from domains.base import Task

NAME = "bfcl_multi_turn"
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
WHEEL = "bfcl-eval==2026.3.23"

# ---------------------------------------------------------------------------------------------------------------
# Finding the wheel, and the OpenAI schema of a BFCL function doc


def wheel_root() -> Path:
    """The installed bfcl_eval package folder; FileNotFoundError (one line: how to get it) when it is missing."""
    try:
        import bfcl_eval
    except ImportError:
        raise FileNotFoundError(f"BFCL multi-turn data not found: the bfcl-eval wheel is not installed; get it "
                                f"with `pip install --no-deps {WHEEL}`") from None
    return Path(bfcl_eval.__file__).parent


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _cast(properties: dict, mapping: dict) -> dict:
    # BFCL's _cast_to_openai_type (model_handler/utils.py, which imports tenacity, so it is copied, not imported):
    # its types (dict, float, tuple, any ...) -> JSON-schema types; a float says so in its description.
    for value in properties.values():
        kind = value.get("type", "string")
        if kind == "float":
            value["format"], value["description"] = "float", value["description"] + " This is a float type value."
        value["type"] = mapping.get(kind, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _cast(value["properties"], mapping)
            elif "items" in value:
                items = value["items"]
                items["type"] = mapping[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _cast(items["properties"], mapping)
    return properties


def openai_schema(doc: dict) -> dict:
    """A BFCL function doc as BFCL's OpenAI handler sends it (convert_to_tool, OPENAI_COMPLETIONS style)."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    item = copy.deepcopy(doc)
    item["name"] = item["name"].replace(".", "_")  # OpenAI names allow no dot (multi-turn names have none)
    item["parameters"]["type"] = "object"
    item["parameters"]["properties"] = _cast(item["parameters"]["properties"], GORILLA_TO_OPENAPI)
    return {"type": "function", "function": item}


# ---------------------------------------------------------------------------------------------------------------
# Tasks: BFCL's entries, their gold calls as {"name", "arguments"}, and what the customer says


def _gold_call(text: str, params: dict[str, list[str]]) -> dict:
    """A gold call string ("sort('final_report.pdf')") -> {"name", "arguments"}: positional arguments get their
    parameter's name from the method's signature, so an agent can replay it as a tool call."""
    node = ast.parse(text.strip(), mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name), f"not a plain call: {text}"
    name = node.func.id
    args = {params[name][i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    return {"name": name, "arguments": args | {k.arg: ast.literal_eval(k.value) for k in node.keywords}}


def backend_config() -> tuple[dict, list, dict]:
    """(class -> module, stateless classes, class -> doc file), from the wheel. Older wheels (e.g. 2025.6.8, whose
    files are still named BFCL_v3_) keep them elsewhere; reading both lets a user run on that data too."""
    wheel_root()  # a missing wheel: one clear line, not an ImportError
    try:
        from bfcl_eval.constants import executable_backend_config as c

        return c.CLASS_FILE_PATH_MAPPING, c.STATELESS_CLASSES, c.MULTI_TURN_FUNC_DOC_FILE_MAPPING
    except ImportError:
        from bfcl_eval.constants.category_mapping import MULTI_TURN_FUNC_DOC_FILE_MAPPING as docs
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import CLASS_FILE_PATH_MAPPING as paths
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import STATELESS_CLASSES as stateless

        return paths, stateless, docs


def load_classes() -> dict[str, type]:
    """The eight multi-turn backend classes, by name (the wheel's mapping also holds BFCL v4's memory / web ones)."""
    import importlib

    paths = backend_config()[0]
    names = ("GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI", "TradingBot", "TravelAPI",
             "VehicleControlAPI")
    return {c: getattr(importlib.import_module(paths[c]), c) for c in names}


def load_tasks(root: Path, classes: dict[str, type], categories=CATEGORIES) -> list[Task]:
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC as REVEAL
    DOC_FILES = backend_config()[2]

    docs = {c: _jsonl(root / "data" / "multi_turn_func_doc" / DOC_FILES[c]) for c in classes}
    params = {n: list(inspect.signature(f).parameters)[1:] for cls in classes.values() for n, f in _methods(cls)}
    tasks = []
    for cat in categories:
        (qfile,) = (root / "data").glob(f"BFCL_v*_multi_turn_{cat}.json")  # named BFCL_v4_: v3's categories
        answers = {a["id"]: a["ground_truth"] for a in _jsonl(root / "data" / "possible_answer" / qfile.name)}
        for e in _jsonl(qfile):
            # as BFCL's populate_test_cases_with_predefined_functions: the classes' docs, held-out ones removed
            funcs = [d for c in e["involved_classes"] for d in docs[c]]
            missed = e.get("missed_function", {})
            held = {int(k): [d for d in funcs if d["name"] in names] for k, names in missed.items()}
            shown = [openai_schema(d) for d in funcs if not any(d in ds for ds in held.values())]
            revealed = {k: [openai_schema(d) for d in ds] for k, ds in held.items()}
            # a held-out turn has no request in the data: BFCL's customer says the functions were updated
            turns = [" ".join(m["content"] for m in q) if k not in held else
                     "\n".join(json.dumps(s) for s in revealed[k]) + "\n" + REVEAL for k, q in enumerate(e["question"])]
            gold = [[_gold_call(c, params) for c in turn] for turn in answers[e["id"]]]
            tasks.append(Task(id=e["id"], domain=NAME, split="test", instructions="\n".join(turns),
                              actions=[c for turn in gold for c in turn], spec={"world": NAME, "turns": turns},
                              raw={"entry": e, "ground_truth": answers[e["id"]], "gold": gold, "category": cat,
                                   "shown": shown, "revealed": revealed}))
    return tasks


def _methods(obj) -> list[tuple[str, object]]:
    # the public methods BFCL maps a call name to (execute_multi_turn_func_call: inspect.getmembers, no "_")
    pred = inspect.ismethod if not isinstance(obj, type) else inspect.isfunction
    return [(n, f) for n, f in inspect.getmembers(obj, predicate=pred) if not n.startswith("_")]


# ---------------------------------------------------------------------------------------------------------------
# Demo: python -m benchmarks.bfcl_data

if __name__ == "__main__":
    task = next(t for t in load_tasks(wheel_root(), load_classes(), ("miss_func",)) if t.id == "multi_turn_miss_func_0")
    print(f"{task.id}: {len(task.raw['shown'])} tools shown, held out: "
          f"{ {k: [s['function']['name'] for s in ss] for k, ss in task.raw['revealed'].items()} }")
    print("gold strings:", task.raw["ground_truth"][3], "-> as a tool call:", task.raw["gold"][3])
    print("a schema:", json.dumps(task.raw["shown"][0])[:300])

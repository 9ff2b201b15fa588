"""A run you look at: runs/<name>/view.html, every conversation in one offline page.

The page is what this project teaches, made visible: which tokens the loss trained, what each
group's advantage was, why each episode got its reward. It is one self-contained HTML file (the
data embedded as JSON, the script inline, no server, no network request) written into the run's
folder at every evaluation and at the end of training, and by eval.py for its evaluation:

    open runs/<name>/view.html                 # any browser, offline
    python -m plumbing.view runs/<name>        # rebuilds the page from the run's files

What it holds, read from the run's files (each may be missing or cut short: the page says so):
    log.jsonl            the curves (reward per GRPO step, held-out pass^1 per evaluation)
    episodes-rank0.jsonl every evaluation episode's messages and reward; a one-line summary of
                         every training episode (reward, stop reason, tool errors)
    view-tokens.jsonl    the token-level record of a fixed sample of training groups, 1-2 a step,
                         appended by runlog.record_tokens as the step is trained: the exact ids the loss saw,
                         their mask, the sampler's and the trainer's log-probs of the trained tokens,
                         each piece's author (the episode's spans), its advantage

Sanity flags are computed here, not eyeballed: trained tokens inside customer or tool text (must be
0), an episode whose decoded text re-tokenises to other ids, an episode cut by the context limit.

Departures from a full trace viewer:
1. Only the sampled groups carry tokens (the page stays a few MB); if they would still pass
   TOKEN_BUDGET, whole steps are thinned evenly, and the page says how many were left out. Past
   EVAL_BUDGET, the evaluations between the first and the last keep their rewards and
   explanations but not their messages (a GPU run's conversations are long).
2. A token is shown as its own decoded text; a character split across tokens (byte-level BPE) shows
   as a replacement character in each part.
"""

from __future__ import annotations

import html
import json
import math
import os
import sys
import time
from pathlib import Path

from plumbing.runlog import TOKENS, json_safe

PAGE = "view.html"
TEMPLATE = Path(__file__).with_name("view.html")
TOKEN_BUDGET = 2_000_000  # characters of token records a page holds at most (about 2 MB)
EVAL_BUDGET = 4_000_000  # characters of evaluation messages, past which middle evaluations lose theirs


# --------------------------------------------------------------------------------------------------
# Reading a run: every file optional, every line checked


def _jsonl(path: Path, notes: list[str]) -> list[dict]:
    """The JSON objects of a JSONL file; a missing file or an unreadable line is noted, not fatal."""
    if not path.is_file():
        notes.append(f"{path.name} is missing")
        return []
    rows, bad = [], 0
    with open(path, errors="replace") as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(r, dict):
                rows.append(r)
    if bad:
        notes.append(f"{path.name}: {bad} unreadable line(s) skipped (a run killed mid-write?)")
    return rows


def _world(task_id: str) -> str:
    return task_id.split("/", 1)[0] if "/" in task_id else "?"


def _last_per(rows: list[dict], key) -> list[dict]:
    """The last row for each key, in order of first appearance: a step logged again after a resume
    counts once."""
    out = {}
    for r in rows:
        out[key(r)] = r
    return list(out.values())


def _info(r: dict) -> dict:
    return r["info"] if isinstance(r.get("info"), dict) else {}


def _summary(r: dict) -> dict:
    """An episode of episodes-rank0.jsonl in one line: what the filters and the tables read."""
    return {"step": r.get("step"), "task_id": r.get("task_id"), "world": _world(str(r.get("task_id"))),
            "reward": r.get("reward"), "stop": r.get("stop_reason"), "errors": _info(r).get("errors", 0),
            "turns": r.get("turns"), "group": r.get("group"), "seed": str(r.get("seed")),
            "trained": r.get("trained_tokens")}


def _stats(rewards: list[float]) -> tuple[float, float]:
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    return mean, (sum((r - mean) ** 2 for r in rewards) / max(1, len(rewards) - 1)) ** 0.5


def _flags(groups: list[dict], summaries: list[dict], evals: list[dict]) -> tuple[dict, dict]:
    """(the sanity checks, each should be 0; what is worth knowing but no fault), counted over
    every recorded episode."""
    trained_elsewhere = retok = lit_mismatch = cut_turns = 0
    for g in groups:
        for e in g["episodes"]:
            mask = e.get("mask") or ""
            trained_elsewhere += sum(mask[s:t].count("1") for who, s, t in e.get("spans", []) if who != "agent")
            retok += e.get("retok", -1) >= 0
            lit_mismatch += mask.count("1") != e.get("trained", mask.count("1"))
            cut_turns += sum(who == "agent" and t > s and mask[t - 1:t] == "0" for who, s, t in e.get("spans", []))
    context = sum(e.get("stop") == "context_full" for e in summaries + evals)
    return {"trained tokens inside customer, tool or prompt text": trained_elsewhere,
            "episodes whose text re-tokenises to other ids": retok,
            "episodes cut by the context limit": context,
            "mask and trained-token count disagree": lit_mismatch}, \
        {"agent turns cut by max_new_tokens (their end-of-turn token is not trained)": cut_turns}


def _bound_evals(evals: list[dict], notes: list[str]) -> list[dict]:
    """Past EVAL_BUDGET, the messages of the middle evaluations (the latest first) are left out; the
    first and the last evaluation keep theirs, whatever their size (the before / after view)."""
    size: dict[str, int] = {}
    for e in evals:
        size[e["name"]] = size.get(e["name"], 0) + len(json.dumps(e["messages"]))
    names, total, dropped = list(size), sum(size.values()), []
    for name in reversed(names[1:-1]):
        if total <= EVAL_BUDGET:
            break
        total -= size[name]
        dropped.append(name)
    if dropped:
        notes.append(f"the messages of evaluation(s) {', '.join(reversed(dropped))} (the page's size bound): their "
                     "rewards and explanations are kept")
    return [{**e, "messages": []} if e["name"] in dropped else e for e in evals]


def collect(run_dir: Path, episodes_path: Path | None = None) -> dict:
    """Everything the page shows, as one JSON-able dict; what is missing goes into "notes"."""
    notes: list[str] = []
    own = episodes_path is None  # a training run's folder; else eval.py's transcripts alone
    log = _jsonl(run_dir / "log.jsonl", notes) if own else []
    steps = _last_per([r for r in log if r.get("phase") == "grpo"], lambda r: r.get("step"))
    eval_recs = _last_per([r for r in log if r.get("phase") == "eval"], lambda r: r.get("name"))
    step_of = {r.get("name"): r.get("step", 0) for r in eval_recs}
    eps = _jsonl(episodes_path or run_dir / "episodes-rank0.jsonl", notes)
    summaries = [_summary(r) for r in eps if r.get("phase") != "eval"]
    rules, evals = {}, []
    for r in (r for r in eps if r.get("phase") == "eval"):
        msgs = [m for m in r.get("messages") or [] if isinstance(m, dict)]
        e = {**_summary(r), "name": r.get("name") or r.get("agent") or "evaluation",
             "step": step_of.get(r.get("name"), 0), "info": _info(r)}
        if msgs and msgs[0].get("role") == "system":
            rules.setdefault(e["world"], msgs[0].get("content"))  # the world's rules, once: not in every episode
        evals.append({**e, "messages": [m for m in msgs if m.get("role") != "system"]})
    evals = _bound_evals(evals, notes)
    token_path = run_dir / TOKENS
    groups = _last_per(_jsonl(token_path, notes), lambda r: (r.get("step"), r.get("group"))) if own else []
    groups = [g for g in groups if isinstance(g.get("episodes"), list) and g["episodes"]]
    vocab: dict[str, str] = {}
    for g in groups:
        vocab.update(g.pop("vocab", None) or {})
        g["mean"], g["std"] = _stats([float(e.get("reward") or 0) for e in g["episodes"]])
        for e in g["episodes"]:  # (a record from an older version may lack any of these)
            for key, empty in (("ids", []), ("mask", ""), ("lp", []), ("tlp", None), ("spans", []), ("adv", 0),
                               ("info", {}), ("seed", ""), ("stop", None), ("reward", 0)):
                e.setdefault(key, empty)
            e.setdefault("trained", e["mask"].count("1"))
        if not any(e["ids"] for e in g["episodes"]):
            notes.append(f"step {g.get('step')} group {g.get('group')}: episodes without tokens (message-level)")
    # the size bound: whole steps thinned evenly, first and last kept
    sizes = {}
    for g in groups:
        sizes[g.get("step")] = sizes.get(g.get("step"), 0) + len(json.dumps(g))
    total, order = sum(sizes.values()), sorted(sizes, key=lambda s: (s is None, s or 0))
    if total > TOKEN_BUDGET and len(order) > 2:
        every = math.ceil(total / TOKEN_BUDGET)
        kept = set(order[::every]) | {order[0], order[-1]}
        notes.append(f"token records of {len(kept)} of {len(order)} steps kept (every {every}th: the page's size "
                     "bound)")
        groups = [g for g in groups if g.get("step") in kept]
    flags, facts = _flags(groups, summaries, evals)
    curves = {"train": [{k: r.get(k) for k in ("step", "reward", "trained_tokens", "kl", "turns", "logp_gap")}
                        for r in steps],
              "eval": [{"name": r.get("name"), "step": r.get("step", 0), "pass1": r.get("pass^1")} for r in eval_recs]}
    return {"run": run_dir.resolve().name, "made": time.strftime("%Y-%m-%d %H:%M:%S"), "notes": notes,
            "curves": curves, "flags": flags, "facts": facts, "vocab": vocab, "rules": rules, "groups": groups,
            "train": summaries, "evals": evals}


# --------------------------------------------------------------------------------------------------
# Writing the page


def render(data: dict) -> str:
    """The template with the data embedded as JSON ("</" escaped: the data cannot close the script)."""
    blob = json.dumps(json_safe(data), allow_nan=False, separators=(",", ":")).replace("</", "<\\/")
    page = TEMPLATE.read_text()
    return page.replace("__TITLE__", html.escape(f"muarl run: {data.get('run', '')}")).replace("__DATA__", blob)


def write(run_dir, episodes: str | Path | None = None) -> Path | None:
    """Build run_dir/view.html (written aside, then renamed); None and one printed line if it fails:
    the page never costs a run its other files. `episodes`: eval.py's transcripts, if not the
    run's episodes-rank0.jsonl; in a training run's folder their page is <transcripts>-view.html,
    so the run's own page stays."""
    run_dir = Path(run_dir)
    page = run_dir / PAGE
    if episodes and (run_dir / "log.jsonl").is_file():
        page = run_dir / f"{Path(episodes).stem}-view.html"
    try:
        data = collect(run_dir, Path(episodes) if episodes else None)
        tmp = page.with_name(page.name + ".tmp")
        tmp.write_text(render(data), encoding="utf-8")
        os.replace(tmp, page)
        return page
    except Exception as err:  # noqa: BLE001 - a page that cannot be made is said in one line, nothing more
        print(f"view: {page} not written ({type(err).__name__}: {err})", flush=True)
        return None


if __name__ == "__main__":  # python -m plumbing.view RUN_DIR [EPISODES.jsonl]: the page, rebuilt
    if len(sys.argv) not in (2, 3) or not Path(sys.argv[1]).is_dir():
        print("usage: python -m plumbing.view RUN_DIR [EPISODES.jsonl]", file=sys.stderr)
        sys.exit(2)
    path = write(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else None)
    if path is None:
        sys.exit(1)
    print(f"{path} ({path.stat().st_size / 1e6:.2f} MB): open it in a browser")

"""Where does the in-loop customer fidelity of a CPU-demo run fall? Split by what the agent said.

A run logs, at every evaluation, the share of held-out conversations whose customer kept to its instructions
(store.customer_mistakes). This splits that share by the agent's side of the conversation:

    policy lines   every text the agent wrote is one of the policy's lines (ask for the id, ask the option question,
                   refuse, refuse again, done), with the order's own id and status filled in
    other text     at least one agent text is none of them: a line GRPO garbled on its way from one habit to another
                   ("I am sorry, but the policy do thir", "arguments": {"sum ..."), half a tool call, repeated words

The customer model was trained and gated against the policy's lines and a noisy agent's (demo/customer.py: other
policy lines, policy words in random order, a fumbled refusal, a piece of a tool call); a drifted policy's garble is
mostly refusal words run into a tool call, which neither holds. Seed 5 at 55 % (2026-11-29):
91.5 % at step 10 overall, 33 of its 34 unfaithful conversations had other text.

    python demo/probes/fidelity_split.py runs/seed5 [runs/seed17 ...]

Reads RUN/episodes-rank0.jsonl (the evaluations' episodes, with the mistakes the run logged); no model, no server.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from demo.worlds import shop, store  # noqa: E402


FIXED = {store.ASK_ID, shop.ASK_REASON, shop.ASK_REFUND, store.REFUSE_AGAIN}  # the policy's lines without blanks
FORMS = [re.compile(re.escape(f).replace(r"\{\}", r"(?:#W\d+|[a-z]+)"))  # "Sorry, order {} is {}, so ..." / "Done: ..."
         for f in (*shop.REFUSE.values(), *shop.DONE.values())]


def policy_line(text: str) -> bool:
    """Is `text` one of the store policy's agent lines (any order id, any status)?"""
    return text in FIXED or any(f.fullmatch(text) for f in FORMS)


def split(episodes) -> dict:
    """{evaluation name: {"policy lines" | "other text": [conversations, faithful]}} over evaluation episodes."""
    out = defaultdict(lambda: {"policy lines": [0, 0], "other text": [0, 0]})
    for e in episodes:
        if e.get("phase") != "eval" or "customer_mistakes" not in (e.get("info") or {}):
            continue
        texts = [m.get("content") or "" for m in e["messages"] if m.get("role") == "assistant"
                 and not m.get("tool_calls") and not m.get("malformed")]  # (a malformed call ends the episode)
        cell = out[e["name"]]["policy lines" if all(map(policy_line, texts)) else "other text"]
        cell[0] += 1
        cell[1] += not e["info"]["customer_mistakes"]
    return dict(out)


def _pct(n: int, ok: int) -> str:
    return f"{100 * ok / n:.1f} % of {n}" if n else "-"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    runs = ap.parse_args(argv).runs
    lowest = []
    for run in runs:
        path = run / "episodes-rank0.jsonl"
        if not path.is_file():
            raise SystemExit(f"fidelity_split: {path} not found (a run directory of python -m demo)")
        with path.open() as f:
            rows = split(json.loads(line) for line in f if line.strip())
        print(f"\n{run}\n| evaluation | all | policy lines only | other agent text |\n|---|---|---|---|")
        for name, cells in rows.items():
            n, ok = (sum(c[i] for c in cells.values()) for i in (0, 1))
            print(f"| {name} | {_pct(n, ok)} | {_pct(*cells['policy lines'])} | {_pct(*cells['other text'])} |")
            lowest.append((ok / max(1, n), *cells["policy lines"], run, name))
    if lowest:
        low, n, ok, run, name = min(lowest, key=lambda r: r[0])
        print(f"\nlowest in-loop fidelity: {100 * low:.1f} % ({run}, {name}); on its policy-line conversations "
              f"{_pct(n, ok)}")


if __name__ == "__main__":
    main()

"""How strongly does a CPU-demo policy read what the customer says? Probabilities where a choice depends on it alone.

The cold start imitates an annotator that writes the customer's option for half of those who want the non-default
one, and holds a refusal against an insisting customer one time in five (demo/worlds/store.py, make_task). So in its
data p(other option | the customer said it) = 0.5 and p(refuse again | the customer insists) = 0.2; GRPO has to move both
to 1 (and the second without touching p(transfer | the customer asks for a human) = 1). This prints what a saved
model gives each, teacher-forced on training conversations (store.option_cases; the annotator's refusals), the two
continuations compared at the decision (their log-probabilities differ only there):

    option    p(other | said other), p(other | said default), per request: a model that reads the answer has the
              first well above the second; greedy evaluation writes the other option only where it is above 0.5
    insist    p(refuse again | insists) against the transfer; and p(refuse again | asks for a human), which should
              stay near 0
    written   from the run's transcripts: per evaluation and request, the held-out conversations whose customer
              wants the non-default option (no change of mind) that wrote it (greedy)

Sampling at top-p 0.9 (the demo's) never draws a continuation whose first token has less mass than the last 10 %, so
a probability that falls near there during GRPO does not come back. Seed 17 (Intel, measured 2026-11-28):
one GRPO step took p(other | said other) for refunds from 0.245 to 0.089.

    python demo/probes/read_probe.py runs/seed17                        # the run's cold start, and its evaluations
    python demo/probes/read_probe.py runs/seed17 --model runs/seed17/final runs/seed17/checkpoints/step-000010/model.pt
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from demo.baselines import world_of  # noqa: E402
from demo.drills import _logp, holds_refusal  # noqa: E402
from demo.worlds import store  # noqa: E402


def p_first(model, tok, system: str, before: list[dict], first: dict, second: dict) -> float:
    """p(first) / (p(first) + p(second)): two continuations of `before`, teacher-forced."""
    lp = [_logp(model, tok, system, [], before + [m]) for m in (first, second)]
    return 1 / (1 + math.exp(lp[1] - lp[0]))


def probe(model, tok, world) -> dict[str, float]:
    train, out = world.tasks("train"), {}
    for request, cases in store.option_cases(train).items():
        for said, k in (("other", 1), ("default", 0)):  # case: (said default, said other, write default, write other)
            p = [p_first(model, tok, world.rules, c[k], c[3], c[2]) for c in cases]
            out[f"{request}: p(other | said {said})"] = sum(p) / max(1, len(p))
    for behaviour, cases in store.hold_cases(train, n=24).items():  # the cold start's third probe, on either kind
        out[f"p(refuse again | {behaviour})"] = holds_refusal(model, tok, cases, world.rules)
    return out


def written_other(run: Path, world) -> dict[str, str]:
    """From a run's transcripts (the eval phase of episodes-rank0.jsonl): per evaluation and request, how many of the
    held-out conversations whose customer wants the non-default option (no change of mind) wrote it."""
    spec, count = {t.id: t.spec for t in world.tasks("test")}, {}
    for line in open(run / "episodes-rank0.jsonl"):
        e = json.loads(line)
        s = spec.get(e["task_id"]) if e.get("phase") == "eval" else None
        arg = store.CHOICES[s["request"]][0] if s else None
        if not s or not s.get("choice") or s["change"] or s["choice"] == store.shop.DEFAULT[arg]:
            continue
        writes = [c["function"]["arguments"].get(arg) for m in e["messages"] for c in m.get("tool_calls") or []
                  if isinstance(c["function"].get("arguments"), dict) and arg in c["function"]["arguments"]]
        n = count.setdefault(e["name"], {}).setdefault(s["request"], [0, 0])
        n[0], n[1] = n[0] + (writes[-1:] == [s["choice"]]), n[1] + 1
    return {name: ", ".join(f"{r} {a}/{n}" for r, (a, n) in d.items()) for name, d in count.items()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="a CPU-demo policy's option read and refusal hold, teacher-forced")
    ap.add_argument("run", help="a run folder (its config.json: the world)")
    ap.add_argument("--model", nargs="*", default=[], help="saved models (folders) or checkpoints (model.pt) to "
                    "probe besides the run's cold start")
    a = ap.parse_args()
    run = Path(a.run)
    if not (run / "config.json").is_file() or not (run / "cold-start").is_dir():
        sys.exit(f"read_probe: {run} has no config.json or cold-start/ (a CPU-demo run folder is needed)")
    world, _ = world_of(json.loads((run / "config.json").read_text()))
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(run / "cold-start")
    for name in ["cold-start", *a.model]:  # the cold start first: a checkpoint's state dict is loaded into its model
        path = run / name if name == "cold-start" else Path(name)
        try:
            if path.is_dir():
                model = AutoModelForCausalLM.from_pretrained(path).eval()
            else:  # a checkpoint's model.pt: a state dict for the same architecture (weights only: no code runs)
                model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        except Exception as e:  # a missing, damaged or foreign file: say which, no traceback
            sys.exit(f"read_probe: cannot load {path}: {type(e).__name__}: {str(e)[:200]}")
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in probe(model, tok, world).items()), flush=True)
    if (run / "episodes-rank0.jsonl").is_file():
        for name, line in written_other(run, world).items():
            print(f"held-out, the customer wants the other option, written: {name}: {line}")

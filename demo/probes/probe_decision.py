"""What does the store's agent decide right after it looks an order up? p(refuse), per request and status.

The store's policy allows a cancellation of a pending order and a return of a delivered one, and nothing else. So the
decision after a lookup depends on the request (said by the customer, turns earlier) AND the status (in the tool's
answer), and for pending and delivered orders neither alone says it. This probe reads that decision off a trained
agent: for each held-out conversation of an evaluation in the run's transcripts, the conversation as the agent had it
when it first spoke after the lookup (its own thought included, if it wrote one), and the probability it gives each
of the four lines it could say next, renormalised over them; p(refuse) is the first two together:

    refuse      "Sorry, order #W1 is pending, so it cannot be returned."
    refuse      the same with the other request ("... so it cannot be cancelled.": the status's refusal)
    ask (own)   the request's question ("Where should the refund go: ...?" for a return)
    ask (other) the other request's question: the status's flow, for a customer who asked for the other thing

An agent that reads the request puts p(refuse) near 1 exactly where the status forbids the request; one that decides
by the status alone gives the same p(refuse) for both requests on an order (the README's "status flow").

    python demo/probes/probe_decision.py runs/muarl                    # the cold start (runs/muarl/cold-start)
    python demo/probes/probe_decision.py runs/muarl --model final --eval "GRPO (40 steps)"
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chat import assistant_ids, encode, render  # noqa: E402
from demo.worlds import shop, store  # noqa: E402
from plumbing.models import load_policy  # noqa: E402


def line_logprob(model, prompt: list[int], line: list[int]) -> float:
    """log p(line | prompt): the sum of the line's token log-probs, one forward pass."""
    ids = torch.tensor([prompt + line])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].float(), -1)  # (len(line), V)
    return float(logp.gather(1, torch.tensor(line)[:, None]).sum())


def probe(run: Path, model_dir: str, eval_name: str) -> dict:
    """{(request, status): [p(refuse), ...]} over the evaluation's conversations that looked an order up."""
    model, tok = load_policy(str(run / model_dir))
    model.eval()
    out = defaultdict(list)
    with open(run / "episodes-rank0.jsonl") as f:
        eps = [e for e in map(json.loads, f) if e.get("phase") == "eval" and e.get("name") == eval_name]
    for e in eps:
        ms = e["messages"]
        at = next((i for i, m in enumerate(ms) if m["role"] == "tool" and m.get("name") == "get_order_details"
                   and m["content"].startswith("{")), None)
        if at is None:
            continue
        order = json.loads(ms[at]["content"])
        status, oid = order["status"], order["order_id"]
        # up to the agent's first words after the lookup: its further tool calls (a thought) and their results stay
        end = next((i for i in range(at + 1, len(ms)) if ms[i]["role"] == "assistant" and not ms[i].get("tool_calls")),
                   None)
        if end is None:
            continue
        first = next(m["content"] for m in ms if m["role"] == "user")
        request = "return" if "return" in first.lower() else "cancel"
        prompt = encode(tok, render(tok, ms[:end], None, add_generation_prompt=True))
        other = "return" if request == "cancel" else "cancel"
        asks = {"cancel": shop.ASK_REASON, "return": shop.ASK_REFUND}
        lines = [shop.REFUSE[request].format(oid, status), shop.REFUSE[other].format(oid, status), asks[request],
                 asks[other]]
        lp = [line_logprob(model, prompt, assistant_ids(tok, {"role": "assistant", "content": t})) for t in lines]
        p = [math.exp(x - max(lp)) for x in lp]
        out[(request, status)].append((p[0] + p[1]) / sum(p))  # either refusal counts as refusing
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="p(refuse) after the lookup, per request and status, from a run's agent")
    p.add_argument("run", help="a run folder of the store world (README command 1)")
    p.add_argument("--model", default="cold-start", help="the model folder inside the run (cold-start, final)")
    p.add_argument("--eval", default="cold start", help="whose transcripts give the conversations (an evaluation's name)")
    a = p.parse_args()
    run = Path(a.run)
    if not (run / a.model).is_dir() or not (run / "episodes-rank0.jsonl").is_file():
        sys.exit(f"probe_decision: {run} has no {a.model}/ or no episodes-rank0.jsonl")
    res = probe(run, a.model, a.eval)
    if not res:
        sys.exit(f"probe_decision: no conversation of the evaluation {a.eval!r} looked an order up")
    print(f"{run}: {a.model}, on the conversations of the evaluation {a.eval!r}\n")
    print("| request | status | the policy | conversations | mean p(refuse) | min | max |\n|---|---|---|---|---|---|---|")
    for (request, status), ps in sorted(res.items()):
        allowed = (request, status) in store.ALLOWED
        print(f"| {request} | {status} | {'do it' if allowed else 'refuse'} | {len(ps)} | {sum(ps) / len(ps):.2f} | "
              f"{min(ps):.2f} | {max(ps):.2f} |")

"""Copy drills, the CPU demo's stand-in for pre-training, and the probes of its cold start (the
demo's kit).

A pre-trained model can copy a string it has just read (an order id, a customer's words); the random
tiny model (demo/tiny.py) cannot. Drills "#W123 lamp #W904 ... || #W123 lamp #W904 ..." (loss on the
second half only, mask 1:
the only way down is to look back and copy, an induction head) train with sft.train, the cold
start's loop. What the cold start then learns from ~1,000 conversations is luck at 4 epochs:
until_lookup probes it and trains again.

    python -m demo.drills            # drills a fresh tiny model for 100 steps, prints the loss
"""

from __future__ import annotations

import functools
import math
import random

import torch

import chat
import sft
from plumbing.fsdp import compute_device
from demo.worlds import store


def copy_examples(tokenizer, n: int, seed: int = 0, words: list[str] | None = None, max_items: int = 8):
    """n (ids, mask) drills of copying from context: "#W123 lamp #W904 ... || #W123 lamp #W904 ...",
    the loss on the second half only (mask 1: see the module's docstring). Items: '#W' + 3 digits,
    or a word from `words`."""
    rng = random.Random(seed)
    words = words or ["order", "cancel", "return", "gift", "card", "payment", "mistake", "needed", "lamp", "mug"]
    out = []
    for _ in range(n):
        text = " ".join([f"#W{rng.randint(100, 999)}" if rng.random() < 0.6 else rng.choice(words)
                         for _ in range(rng.randint(2, max_items))])
        first = tokenizer.encode(text + " ||", add_special_tokens=False)
        second = tokenizer.encode(" " + text, add_special_tokens=False)
        out.append((first + second, [0] * len(first) + [1] * len(second)))
    return out


def copy_warmup(model, tokenizer, steps: int, lr: float, words: list[str], seed: int = 0, log=None,
                converged: float = 0.15, **common) -> float:
    """Copy drills until they take: `steps` steps of copy_examples, another round while the last
    ended above loss `converged`, 3 rounds at most. A model that copies badly learns neither the
    rule lookup nor to read the customer's option later, so a stall is named. Each round is a
    logged stage. Returns the mean of the last 20 losses."""
    for attempt in range(3):
        drills = copy_examples(tokenizer, 16 * steps, seed=seed + attempt, words=words)
        losses = sft.train(model, drills, epochs=1, batch_size=16, lr=lr, warmup=20, desc="copy drills", seed=seed,
                       log=lambda r: log and log({**r, "phase": "copy_warmup"}), **common)
        tail = sum(losses[-20:]) / max(1, len(losses[-20:]))
        if log:
            log({"phase": "stage", "stage": "copy_drills", "attempt": attempt, "loss": tail, "ok": tail < converged})
        if tail < converged:
            break
        print(f"[stage] copy drills did not converge (loss {tail:.2f}, converged < {converged})" +
              (f": round {attempt + 2} of 3" if attempt < 2 else ": the cold start will copy badly"), flush=True)
    return tail


def _logp(model, tokenizer, system: str, tools, messages: list[dict]) -> float:
    """log p of the agent's tokens of a conversation (teacher-forced: the mask says which tokens are
    the agent's), the model in eval mode meanwhile (then as it was)."""
    ids, mask = chat.conversation_ids(tokenizer, system, list(tools), messages)
    was = model.training
    with torch.no_grad():  # logits: (T-1, V), the next token's at each position
        logits = model.eval()(torch.tensor([ids], device=compute_device(model))).logits[0, :-1]
    model.train(was)
    logp = torch.log_softmax(logits.float(), -1)
    return float((logp.cpu().gather(1, torch.tensor(ids[1:])[:, None])[:, 0] * torch.tensor(mask[1:])).sum())


def lookup_right(model, tokenizer, cases, system: str, tools: list[dict] = ()) -> float:
    """The share of `cases` (store.lookup_cases) where the model prefers the right thought (or act)
    to every wrong one:
    log p of the agent's tokens of the conversation ending in each (teacher-forced; they differ in
    the last step)."""
    lp = functools.partial(_logp, model, tokenizer, system, tools)
    return sum(lp(before + [good]) > max(lp(before + [b]) for b in bad)  # (before, the right step, the wrong ones)
               for before, good, *bad in cases) / max(1, len(cases))


def reads_option(model, tokenizer, cases, system: str, tools: list[dict] = (), moves: float = 1.25) -> float:
    """The share of `cases` (store.option_cases) where the customer's answer moves the model's
    choice: the odds p(other) / p(default) at the write call are >= `moves` times higher after "the
    other" than after "the default" (a model that does not read the answer: the same odds after
    either, ratio 1)."""
    lp = functools.partial(_logp, model, tokenizer, system, tools)
    log_odds = lambda said, default, other: lp(said + [other]) - lp(said + [default])  # noqa: E731
    return sum(log_odds(said_o, w_d, w_o) - log_odds(said_d, w_d, w_o) > math.log(moves)
               for said_d, said_o, w_d, w_o in cases) / max(1, len(cases))


def holds_refusal(model, tokenizer, cases, system: str, tools: list[dict] = ()) -> float:
    """The mean of p(refuse again) / (p(refuse again) + p(transfer)) over `cases` (store.hold_cases'
    "insist"): how often the model holds a refusal against an insisting customer (the annotator:
    0.2; GRPO learns it only if drawn). (log p(transfer) - log p(again) capped at 700: exp overflows
    above ~709.)"""
    lp = functools.partial(_logp, model, tokenizer, system, tools)
    return sum(1 / (1 + math.exp(min(lp(before + [transfer]) - lp(before + [again]), 700)))
               for before, again, transfer in cases) / max(1, len(cases))


def until_lookup(model, tok, examples, epochs: float, worlds: dict, tasks: list, tools_in_prompt: bool, draws: int,
                 log=None, takes: float = 0.95, hold: float = 0.1, **train) -> list:
    """The cold start's SFT (sft.train's arguments) and three probes of it on the training
    conversations of `tasks`: the rule lookup (lookup_right on store.lookup_cases: the thought's
    status, request, answer, the act) right on `takes` of them; the option read (reads_option on
    store.option_cases) of cancellations and returns on half, since the annotator writes the other
    option for half of the customers who want it; the refusal held (holds_refusal on
    store.hold_cases) at `hold`, half the annotator's 0.2, because at top-p 0.9 GRPO rarely draws a
    rarer action. A draw that did not take trains again, `draws` times at most, one of two ways:
      longer  a step of the lookup failed and this draw was not trained on yet: its weights train
              3/4 of its epochs more (the lookup is slow to learn, not wrongly learnt);
      again   else: SFT again from the drills' weights, the examples in another order (a new seed),
              with the annotator's held refusals three times after a failed hold. An option read
              that failed is drawn again: more epochs do not mend it.
    Keeps the first draw that passed, else the one failing fewest, named; returns its losses.
    `log` receives the SFT steps and one record per probe."""
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}  # the drills' weights
    losses = sft.train(model, examples, epochs=epochs, log=log, **train)
    if "store" not in worlds or not all((probes := store.lookup_cases(tasks)).values()):
        return losses  # another domain: no such thought to probe
    world, options = worlds["store"], store.option_cases(tasks)
    insist = store.hold_cases(tasks)["insist"]  # (and the conversations where the annotator held one)
    held = [e for e in examples if store.REFUSE_AGAIN in tok.decode(e[0])] if insist else []
    tools, extra = world.tool_schemas() if tools_in_prompt else [], 0.75 * epochs  # extra: a longer draw's
    tries, trained, longer = [], epochs, False  # trained: this draw's epochs so far; longer: it was trained on
    for k in range(draws + 1):
        if k:  # the draw before failed (see the docstring): longer, or again from the drills' weights
            if not longer:
                model.load_state_dict(start)
            more = examples + held * 2 * any("holds insist" in t[2] for t in tries)  # a hold failed: 3 times
            losses = sft.train(model, more, epochs=extra if longer else epochs, log=log,
                               **{**train, "seed": train.get("seed", 0) + 1000 * k})
            trained = trained + extra if longer else epochs
        shares = {kind: lookup_right(model, tok, cases, world.rules, tools) for kind, cases in probes.items()}
        reads = {f"reads {r}": reads_option(model, tok, c, world.rules, tools) for r, c in options.items() if c}
        reads |= {"holds insist": holds_refusal(model, tok, insist, world.rules, tools)} if insist else {}
        failed = [n for n, v in shares.items() if v < takes] + [n for n, v in reads.items() if v < (
            hold if n == "holds insist" else 0.5)]
        if log:
            log({"phase": "stage", "stage": "lookup", "draw": k, "right": min(shares.values()), "epochs": trained,
                     "longer": longer, **shares, **reads, "ok": not failed})
        tries.append(((len(failed), -min(shares.values()), -reads.get("holds insist", 1)), k, failed, losses,
                      {n: v.detach().clone() for n, v in model.state_dict().items()} if failed else None))
        if not failed:
            break
        longer = not longer and bool(set(failed) & set(probes))  # (a draw trained on once: the next is drawn again)
        read = ", ".join(f"{n} {100 * v:.1f} %" for n, v in {**shares, **reads}.items())
        then = (f": trains {extra:g} epochs more" if longer else ": drawn again") * (k < draws)
        print(f"[stage] cold start draw {k}: {read} (takes at: lookup {100 * takes:.0f} %, options 50 %, hold "
              f"{100 * hold:g} %): {', '.join(failed)} did not take" + then, flush=True)
    _, k, failed, losses, weights = min(tries, key=lambda t: t[0])  # the first of the best
    if failed:  # (a draw that passed is the last one, already in the model)
        model.load_state_dict(weights)
        print(f"[stage] the cold start did not take after {len(tries)} draw{'s' * (len(tries) > 1)}: kept draw {k},"
              f" where {', '.join(failed)} did not (the agent decides without them)", flush=True)
    return losses


def words_of(tasks) -> list[str]:
    """The words of the tasks' expert conversations (of the first 400): what the drills copy beside
    order ids."""
    import re

    return sorted({w for t in tasks[:400] for msg in t.expert or [] for w in re.findall(r"[a-z]+", msg.get("content")
                                                                                         or "")})


if __name__ == "__main__":
    import tempfile

    from demo.tiny_model import build_tiny

    model, tok = build_tiny(tempfile.mkdtemp(prefix="muarl-drills-"), hidden=128, layers=2, vocab_size=512,
                            intermediate=512, split_digits=True)
    print("one drill:", repr(tok.decode(copy_examples(tok, 1, seed=0)[0][0])))
    print(f"loss after 100 steps: {copy_warmup(model, tok, 100, 3e-3, ['lamp', 'mug'], micro_batch_tokens=512):.3f}")

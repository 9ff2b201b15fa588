"""What a run writes as it goes: log.jsonl with one global step, strictly valid JSON, optional
TensorBoard / wandb; samples.txt; the page's token records.

One counter, `global_step`, runs across the phases (copy drills, cold start, GRPO): each training
record is one optimizer step; an evaluation record carries the value of the model it measured (and
its GRPO `step`). Python's json writes NaN and Infinity, which are not JSON (jq refuses the line):
they are logged as null, listed under "nonfinite". TensorBoard (torch's SummaryWriter; needs
`tensorboard`) and wandb are imported only when asked for (--logger).

What a GRPO step writes (muarl.py's step 7), all of it here:
    step_stats      what the step's line in log.jsonl says about its episodes
    write_sample    every 10 steps one whole episode with its mask, in samples.txt
    page_groups     the groups the run's page shows token by token (the first, and one that teaches)
    record_tokens   those groups as the loss saw them, appended to view-tokens.jsonl (plumbing/view.py
                    builds the page from it)
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path

from plumbing.fsdp import all_gather_episodes, all_sum

TOKENS = "view-tokens.jsonl"  # the token records, one line per sampled group (a run log: cut back on resume)
GROUPS_A_STEP = 2  # sampled groups a step: the first, and the first that teaches if the first does not
TRAINING = ("copy_warmup", "sft", "grpo")  # phases whose every record is one optimizer step


def json_safe(v):
    """`v` with every NaN or infinity (in nested dicts and lists too) as None: JSON has neither, and
    a browser's JSON.parse refuses them."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    return [json_safe(x) for x in v] if isinstance(v, list) else v


def finite(record: dict) -> dict:
    """The record made JSON-safe (json_safe); the keys that held a non-finite float are listed under
    "nonfinite"."""
    out = {k: json_safe(v) for k, v in record.items()}
    bad = [k for k, v in record.items() if out[k] != v or isinstance(v, float) and not math.isfinite(v)]
    return {**out, "nonfinite": bad} if bad else out


def _hook(kind: str, out: Path, config: dict | None):
    """The optional logger: a function record -> None, or None for "none". Imported here, only when
    asked for."""
    if kind == "none":  # (config.validate allows none, tensorboard, wandb)
        return None
    try:
        if kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(out / "tensorboard"))
            return lambda name, value, step: writer.add_scalar(name, value, step)
        import wandb

        wandb.init(project="muarl", dir=str(out), config=config or {})
        return lambda name, value, step: wandb.log({name: value}, step=step)
    except ImportError as e:
        raise ValueError(f"--logger {kind} needs the {kind} package ({e}): pip install {kind}") from None


def customer_fidelity(mistakes: list, rewards: list[float]) -> dict:
    """Share of checkable episodes whose customer kept to its instructions, and share of all scored
    episodes that failed with a customer mistake in them (the reward then says nothing sure about
    the agent). {} if none."""
    checked = [(m, r) for m, r in zip(mistakes, rewards) if m is not None]
    return {"customer_fidelity": sum(not m for m, _ in checked) / len(checked),
            "customer_faults": sum(bool(m) and r < 1 for m, r in checked) / len(checked)} if checked else {}


def step_stats(episodes, kept_groups: int, group_size: int, world_size: int = 1) -> dict:
    """What a step's episodes did, over every rank's; means over scored episodes (an aborted one has
    no reward).

    The paper's training dynamics are these numbers per step: reward, the groups GRPO cannot learn
    from (all correct / all wrong), turns, the shares of the generic tools among calls (think,
    transfer), and where the rollout's time went (policy generation, customer, tools: each episode's
    share of its rounds, summed). Where the world can check its customer (store), the share of
    episodes whose customer kept to its instructions, and the share that failed with a customer
    mistake in them: a reward earned against a customer that broke its instructions is no signal."""
    # only what the statistics need crosses ranks (all_gather_episodes pickles these small dicts)
    eps = all_gather_episodes([{"reward": e.reward, "turns": e.turns, "agent_tokens": sum(e.mask),
                                "tokens": len(e.ids), "tool_calls": list(e.tool_calls), "stop_reason": e.stop_reason,
                                "aborted": e.aborted, "mistakes": getattr(e, "info", {}).get("customer_mistakes"),
                                "timings": dict(getattr(e, "timings", {}))} for e in episodes], world_size)
    scored = [e for e in eps if not e["aborted"]]
    n, calls = max(1, len(scored)), Counter(c for e in scored for c in e["tool_calls"])
    groups = [g for g in (eps[i : i + group_size] for i in range(0, len(eps), group_size))
              if not any(e["aborted"] for e in g)]
    return {
        "reward": sum(e["reward"] for e in scored) / n,
        "all_correct_groups": sum(all(e["reward"] == 1 for e in g) for g in groups) / max(1, len(groups)),
        "all_wrong_groups": sum(all(e["reward"] == 0 for e in g) for g in groups) / max(1, len(groups)),
        "kept_groups": int(all_sum(kept_groups, world_size)), "episodes": len(eps), "aborted": len(eps) - len(scored),
        "tokens": sum(e["tokens"] for e in eps), "turns": sum(e["turns"] for e in scored) / n,
        "agent_tokens": sum(e["agent_tokens"] for e in scored) / n, "tool_mix": dict(calls),
        **{f"{t}_rate": calls[name] / max(1, sum(calls.values()))
           for t, name in (("think", "think"), ("calculate", "calculate"), ("transfer", "transfer_to_human_agents"))},
        "stop_reasons": dict(Counter(e["stop_reason"] for e in eps)),
        **customer_fidelity([e["mistakes"] for e in scored], [e["reward"] for e in scored]),
        # seconds of this step's rollout by who was working: the policy's engine, the customer, the tools
        **{f"{k}_s": sum(e["timings"].get(k, 0.0) for e in eps) for k in ("generate", "user", "tools")},
    }


def write_sample(out: Path, step: int, episode, shown: str) -> None:
    """One whole episode with its mask (`shown`: chat.show_mask's text, trained tokens in [[...]]),
    appended to out/samples.txt."""
    with open(out / "samples.txt", "a") as f:
        f.write(f"=== step {step}  task {episode.task.id}  reward {episode.reward}  stop {episode.stop_reason}  "
                f"(trained tokens in [[...]])\n{shown}\n\n")


# --------------------------------------------------------------------------------------------------
# The page's token record (view-tokens.jsonl): called from the training loop (rank 0), cheap, never fatal


def page_groups(episodes, adv, G: int) -> list[int]:
    """Indices (into `episodes`, G consecutive per group; `adv` theirs) of the groups to record this
    step: the first group, and the first with an advantage not 0 (one that teaches) if the first
    does not teach."""
    groups = [list(range(g, min(g + G, len(episodes)))) for g in range(0, len(episodes), G)]
    teaching = [g for g in groups if any(any(adv[i]) if isinstance(adv[i], list) else adv[i] for i in g)]
    chosen = groups[:1] + [g for g in teaching[:1] if g != groups[0]]
    return [i for g in chosen[:GROUPS_A_STEP] for i in g]


def _num(x: float, places: int = 3):
    # JSON has no NaN or Infinity: a log-prob outside the trainer's nucleus is -inf, written as null
    return round(float(x), places) if math.isfinite(x) else None


def _retokenises(tok, ids: list[int]) -> int:
    """The first index where encode(decode(ids)) differs from ids, or -1 if it gives them back."""
    again = tok(tok.decode(ids, skip_special_tokens=False), add_special_tokens=False)["input_ids"]
    return next((i for i, (a, b) in enumerate(zip(ids, again)) if a != b), -1 if len(again) == len(ids)
                else min(len(ids), len(again)))


def episode_record(e, adv, trainer_logp: list[float] | None, tok, tis_cap: float = 0.0) -> dict:
    """One episode as the page draws it: ids, mask (a string of 0/1), log-probs at the trained
    positions only (elsewhere they are 0 by construction), spans as [who, start, end]; with the
    loss's sampler correction (`tis_cap` > 0), each trained token's weight min(pi_trainer / pi_sampler,
    C) as grpo.tis_weights computes it."""
    on = [i for i, m in enumerate(e.mask) if m]
    per_token = isinstance(adv, list)
    iw = None if not tis_cap or trainer_logp is None else [
        _num(min(math.exp(max(-20.0, min(20.0, trainer_logp[i] - e.logprobs[i]))), tis_cap)) for i in on]
    return {"seed": str(e.seed), "task": e.task.id, "reward": e.reward, "stop": e.stop_reason,
            "info": e.info, "tool_calls": e.tool_calls, "turns": e.turns, "ids": e.ids,
            "mask": "".join("1" if m else "0" for m in e.mask), "trained": len(on),
            "lp": [_num(e.logprobs[i]) for i in on],
            "tlp": None if trainer_logp is None else [_num(trainer_logp[i]) for i in on],
            "adv": [_num(adv[i]) for i in on] if per_token else _num(adv),
            "spans": [[s["who"], s["start"], s["end"]] for s in e.spans],
            "retok": _retokenises(tok, e.ids) if e.ids else -1, **({"iw": iw} if iw is not None else {})}


def record_tokens(out: Path, step: int, episodes, adv, keep: list[int], trainer_logp: dict, tok, G: int,
           tis_cap: float = 0.0) -> None:
    """Append the groups `keep` of this step's kept episodes to out/view-tokens.jsonl, one line a
    group, with the vocabulary pieces their ids use. A failure prints one line: the run goes on."""
    try:
        lines = []
        for g in sorted({i // G for i in keep}):
            idx = [i for i in keep if i // G == g]
            eps = [episode_record(episodes[i], adv[i], trainer_logp.get(i), tok, tis_cap) for i in idx]
            used = sorted({t for e in eps for t in e["ids"]})
            vocab = dict(zip(used, tok.batch_decode([[t] for t in used], skip_special_tokens=False)))
            first = episodes[idx[0]]  # (group: the task's place in the step's batch, as the episode log has it)
            lines.append({"step": step, "group": first.group, "task": first.task.id, "world": first.task.domain,
                          "vocab": vocab, "episodes": eps})
        with open(Path(out) / TOKENS, "a") as f:
            f.writelines(json.dumps(json_safe(r), allow_nan=False) + "\n" for r in lines)
    except Exception as err:  # noqa: BLE001 - the viewer must never cost the run
        print(f"runlog: step {step}'s token record not written ({type(err).__name__}: {err})", flush=True)


class RunLog:
    """Append-only JSONL (rank 0 only) with the global step; an optional logger mirrors the numbers."""

    def __init__(self, path: Path, rank: int = 0, logger: str = "none", config: dict | None = None):
        self.path, self.rank, self.global_step = Path(path), rank, 0
        self.scalar = _hook(logger, self.path.parent, config) if rank == 0 else None

    def __call__(self, record: dict) -> None:
        if record.get("phase") in TRAINING:
            self.global_step += 1
        if self.rank != 0:
            return
        rec = finite({"time": time.time(), "global_step": self.global_step, **record})
        with open(self.path, "a") as f:
            f.write(json.dumps(rec, allow_nan=False) + "\n")  # allow_nan=False: a NaN we missed fails loudly
        if self.scalar is not None:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("time", "global_step"):
                    self.scalar(f"{rec.get('phase', 'run')}/{k}", v, self.global_step)


if __name__ == "__main__":  # python -m plumbing.runlog: four records, their global steps, NaN and Infinity as null
    import tempfile

    log = RunLog(Path(tempfile.mkdtemp()) / "log.jsonl")
    for phase, extra in (("sft", {"loss": 0.5}), ("sft", {"loss": float("nan")}), ("eval", {"pass^1": 0.6}),
                         ("grpo", {"ratio_min": float("inf"), "reward": 0.7})):
        log({"phase": phase, **extra})
    print(log.path.read_text())

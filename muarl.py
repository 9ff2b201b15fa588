"""MUA-RL training: a cold start on expert conversations, then GRPO on conversations with a customer.

    python muarl.py --model Qwen/Qwen3-8B --user_model gpt-4o-2024-11-20      # the paper's recipe
    torchrun --nproc_per_node 8 muarl.py --model Qwen/Qwen3-8B --user_serve /models/Qwen3-32B
    python -m demo                                   # the CPU demo: a tiny model learns on a laptop

The loop (MUA-RL, Zhao et al. 2025, arXiv:2508.18669, Algorithm 1) is `train()`, one optimizer
step per iteration:

    1 roll out B tasks x G conversations   5 optimizer step (AdamW, grad clip; skipped if non-finite)
    2 score: the final database            6 sync the new weights into the rollout engine
    3 rewards -> group advantages          7 log (JSONL + progress bar)
    4 loss and backward, packed rows       8 evaluate and checkpoint, every so often

Everything before the loop (worlds, tasks, customer, models, the cold start, the engine) is
`build_run()`. A variant plugs its own pieces in through a `Kit` (the CPU demo builds its tiny
model and drills it). Symbols: B = tasks per step, G = group size (rollouts per task),
T = tokens, N_tok = trained tokens in a step.

Departures from the paper (see also the README):
1. One update per batch by default, as the authors ran it: old_logp = logp.detach() (ratio == 1,
   the clip acts only with --mini_batches > 1); each token weighted by min(pi / pi_sampler, C).
2. Groups with an aborted episode (the customer's endpoint failed) are dropped from the step, not
   scored 0; their tasks are drawn again. A customer down longer than --user_down_s stops the run.
"""

from __future__ import annotations

import sys

from config import GROUPS, Config
from plumbing.flags import ConfigError, parse_config, run_cli
from plumbing.validate import early

# the command line first: --help and a bad flag answer before torch loads
if __name__ == "__main__":
    try:
        CLI = parse_config(None, Config, groups=GROUPS, prog="muarl.py")
        early(CLI)
    except ConfigError as e:
        print(f"muarl: config error: {e}", file=sys.stderr)
        sys.exit(2)

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

import sft
from domains import load_worlds, task_sets
from domains.tau2_data import provenance
from engine import check_vllm_model, rollout_engine
from eval import run_eval
from grpo import (ADVANTAGES, REWARDS, grpo_loss, pack_sequences, tis_weights, token_advantages,
                  token_logprobs)
from plumbing import checkpoint as ckpt, view
from plumbing.fsdp import (all_gather_episodes, all_sum, barrier, bf16_compute, compute_device,
                           decide_on_rank0, dist_setup, dist_teardown, even_rows, full_tensors, is_sharded,
                           place, reduce_stats, reshard)
from plumbing.models import reference_for
from plumbing.preflight import RunStopped
from plumbing.runlog import step_stats, write_record, write_sample
from plumbing.sampling import episode_seed
from plumbing.serve import customer_for
from plumbing.startup import prepare
from plumbing.validate import row_note, validate
from rollout import PolicyAgent, RolloutConfig, TrajectoryLog, rollout, score


@dataclass
class Kit:
    """What a variant of the run plugs in; None is the core's own. The CPU demo's (demo/train.py)
    builds a tiny model, drills it before the cold start, probes the cold start, serves and gates its
    customer model."""

    # (cfg, worlds, out) -> model folder; else --model is the policy
    build_model: Callable | None = None
    # (cfg, out, rank, world_size) -> User; else plumbing.serve.customer_for
    customer: Callable | None = None
    # (run, model, examples, **sft.train's arguments); else sft.train
    cold_start: Callable | None = None
    eval_untrained: bool = True  # evaluate the model as loaded, before the cold start
    started: Callable | None = None  # (run) -> None, once the evaluation RL starts from is done


# --------------------------------------------------------------------------------------------------
# 3 + 4 + 5. Advantages and the update


def advantages(episodes, G: int, estimator: str = "grpo", reward: str = "outcome",
               turn_bonus: float = 0.0, drop_faults: bool = False) -> tuple[list, list]:
    """Training rewards (grpo.REWARDS[reward]) -> advantages, group by group (grpo.ADVANTAGES).
    Groups holding an aborted episode are dropped (with `drop_faults`, also those whose customer
    provably broke its instructions). Returns (kept episodes, their advantages: a number or a
    per-token list each)."""
    keep, adv = [], []
    for g in range(0, len(episodes), G):
        group = episodes[g : g + G]
        if any(e.aborted or drop_faults and e.info.get("customer_mistakes") for e in group):
            continue
        r = torch.tensor([float(REWARDS[reward](e)) for e in group])  # (G,)
        A = ADVANTAGES[estimator](r, G).tolist()  # (G,)
        adv += [token_advantages(a, e.spans, len(e.ids), turn_bonus) for e, a in zip(group, A)]
        keep += group
    return keep, adv


def update(policy, reference, episodes, advantages, opt, *, row_tokens: int, chunk: int, bf16: bool,
           kl_coef: float, clip: tuple[float, float], sampler: tuple[float, float], grad_clip: float,
           tis_cap: float = 0.0, mini_batches: int = 1, world_size: int = 1, keep=()) -> dict:
    """GRPO on this rank's episodes: pack, log-probs, loss, backward, step; `mini_batches` optimizer
    steps (1: the paper's one update per batch).

    An optimizer step's loss is the token mean over every trained token of its rows on every rank;
    each packed row (of at most `row_tokens`; a longer episode gets a row of its own, counted as
    `long_rows`) adds its share (masked sum / N_tok) to the gradient, so splitting into rows changes
    nothing. With `bf16` the forward computes in bf16 while AdamW updates fp32 weights. `sampler`:
    the engine's (temperature, top-p), so the trainer's log-probs are compared like for like with
    the engine's (`logp_gap`) and weigh each token by min(pi_trainer / pi_engine, tis_cap)
    (grpo.tis_weights; 0: off). `keep`: episodes whose trainer log-probs come back under "seen"
    (the run's page, plumbing/view.py)."""
    rows = pack_sequences([e.ids for e in episodes], [e.mask for e in episodes], row_tokens,
                          adv=advantages, sample_logp=[e.logprobs for e in episodes])
    rows = even_rows(rows, world_size)  # FSDP: as many rows on every rank (one process: unchanged)
    # under FSDP the forward runs as a registered method of the sharded model, so its root gathers
    logprobs = token_logprobs if not is_sharded(policy) else lambda m, *a, **k: m.token_logprobs(*a, **k)
    dev, use_ref = compute_device(policy), reference is not None and kl_coef > 0

    def forward(row):
        """(logp, entropy, logp under the engine's temperature and top-p), (1, L) each."""
        with bf16_compute(policy, bf16):  # the forward in bf16 (fp32 log-softmax inside)
            return logprobs(policy, row["input_ids"], position_ids=row["position_ids"], chunk_size=chunk,
                            return_entropy=True, sampler=sampler)

    # One step: the policy being updated is the one that was rolled out, so old_logp = logp.detach()
    # (ratio 1, the clip never bites) and no extra forward is needed. Several: the policy moves
    # within the batch, so every row's log-probs before the first step are kept now (old_logp).
    start = None
    if mini_batches > 1:
        with torch.no_grad():
            start = [[x.detach() for x in forward({k: v.to(dev) for k, v in row.items()})] for row in rows]
    stats, norms, steps, seen = [], [], 0, {}
    for k in range(mini_batches):
        part = range(k * len(rows) // mini_batches, (k + 1) * len(rows) // mini_batches)
        if not part:  # (more mini-batches than rows: nothing to step on)
            continue
        n_tok = all_sum(float(sum(int(rows[i]["mask"].sum()) for i in part)), world_size)
        opt.zero_grad(set_to_none=True)
        losses = []
        for i in part:
            row = {key: v.to(dev) for key, v in rows[i].items()}  # rows are packed on the CPU
            ids, pos, mask = row["input_ids"], row["position_ids"], row["mask"]  # (1, L) each
            with torch.no_grad(), bf16_compute(policy, bf16):  # (1, L): the frozen reference's, for the KL
                ref_logp = logprobs(reference, ids, position_ids=pos, chunk_size=chunk) if use_ref else None
            if use_ref:
                reshard(reference)  # FSDP2 keeps a root gathered after a no-backward forward
            logp, ent, logp_seen = forward(row)  # (1, L) each
            old_logp, old_seen = (logp.detach(), logp_seen.detach()) if start is None else start[i][::2]
            weight, tis = tis_weights(old_seen, row["sample_logp"], mask, tis_cap) if tis_cap else (None, {})
            loss, st = grpo_loss(logp, old_logp, ref_logp, row["adv"], mask, *clip, kl_coef,
                                 num_tokens=max(n_tok, 1.0), entropy=ent, is_weight=weight)
            loss.backward()
            # engine vs trainer, like for like (clamped: outside the trainer's nucleus is -inf)
            gap = ((row["sample_logp"] - logp_seen).abs().clamp(max=1e3) * mask).sum().item()
            stats.append({**st, **tis, "loss": loss.item(), "logp_gap": gap})
            # the page's sample: each kept episode's trainer log-probs before this batch's steps
            # (setdefault: FSDP's empty padding rows also call their two tokens episode 0)
            for e in set(keep) & set(row["seq_id"][0].tolist()):
                seen.setdefault(e, old_seen[0][row["seq_id"][0] == e].tolist())
            losses.append(loss.item())
        norms.append(float(torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip)))
        # a non-finite loss or gradient skips the step: the weights stay as they were
        if math.isfinite(all_sum(sum(losses), world_size)) and math.isfinite(norms[-1]):
            opt.step()
            steps += 1
    opt.zero_grad(set_to_none=True)
    out = reduce_stats(stats, world_size)  # token-weighted means over every row of every rank
    long_rows = all_sum(float(sum(len(e.ids) > row_tokens for e in episodes)), world_size)
    return {**out, "grad_norm": sum(norms) / len(norms), "skipped": steps == 0, "optimizer_steps": steps,
            "trained_tokens": all_sum(float(sum(sum(e.mask) for e in episodes)), world_size),
            "long_rows": long_rows, **({"seen": seen} if keep else {})}


def update_settings(cfg: Config) -> dict:
    """The run's flags as update() takes them."""
    return dict(row_tokens=cfg.micro_batch_tokens, chunk=cfg.logprob_chunk, kl_coef=cfg.kl_coef,
                bf16=cfg.dtype == "bfloat16", clip=(cfg.clip_low, cfg.clip_high),
                sampler=(cfg.temperature, cfg.top_p), grad_clip=cfg.grad_clip, tis_cap=cfg.tis_cap,
                mini_batches=cfg.mini_batches)


# --------------------------------------------------------------------------------------------------
# Setup: everything before the loop


def build_run(cfg: Config, kit: Kit) -> SimpleNamespace:
    """Worlds, tasks, customer (all that can fail on bad input fails first), then the policy, the
    cold start, the frozen reference and the rollout engine: the run's state, as one namespace. A
    start that fails before the cold start leaves the output folder as it found it
    (plumbing/checkpoint.undo_start)."""
    rank, world_size = dist_setup(cfg.offload)
    validate(cfg, world_size, model_given=kit.build_model is None)
    # dtype, devices; --plan N prints
    cfg, device, engine, on_gpu, sharded = place(cfg, rank, world_size)
    if rank == 0 and (note := row_note(cfg)):  # rows shorter than a conversation: said once
        print(note, flush=True)
    # a model vLLM cannot run: said now, not after SFT
    if engine == "vllm" and kit.build_model is None:
        check_vllm_model(cfg.model, on_cpu=not on_gpu)
    out = Path(cfg.out_dir)
    # --resume: the newest intact checkpoint as rank 0 finds it (every rank resumes the same step);
    # rank 0 names and mends a latest.json that disagrees
    found = decide_on_rank0(lambda: ckpt.resume_point(out, rank) if cfg.resume else None, world_size)
    random.seed(cfg.seed + rank)
    np.random.seed(cfg.seed + rank)
    # the same on every rank: a built model is initialised identically everywhere
    torch.manual_seed(cfg.seed)
    worlds = load_worlds(cfg)
    train_tasks, eval_tasks = task_sets(cfg, worlds)
    if not train_tasks:
        raise ConfigError(f"no training tasks in {cfg.domains}")
    held_out = eval_tasks[: cfg.eval_tasks or None]
    # every input is checked before anything is written: the customer checks what it can now
    user = (kit.customer or customer_for)(cfg, out, rank, world_size)
    user.check(train_tasks + held_out, worlds)
    # Only then is an earlier run set aside (previous-<k>/: never appended to nor overwritten)
    before = {p.name for p in out.iterdir()} if out.is_dir() else None
    out.mkdir(parents=True, exist_ok=True)
    aside = ckpt.set_aside(out) if found is None and rank == 0 else None
    if aside:
        print(f"muarl: the earlier run in {out} is kept in {aside}", flush=True)
    barrier(world_size)
    run = SimpleNamespace(cfg=cfg, rank=rank, world_size=world_size, out=out, worlds=worlds,
                          user=user, train_tasks=train_tasks, held_out=held_out, engine=None,
                          eval_tasks=held_out if cfg.eval else [], results={}, fresh=found is None,
                          sampler=ckpt.TaskSampler(train_tasks, cfg.seed),
                          episodes_log=TrajectoryLog(out / f"episodes-rank{rank}.jsonl"))
    try:  # until the cold start, a failure leaves nothing behind
        prepare(run, kit, found, device, sharded and on_gpu, build=kit.build_model and (
            lambda: kit.build_model(cfg, worlds, out)), sharded=sharded)
    except BaseException:
        if run.fresh and rank == 0:
            user.close()
            ckpt.undo_start(out, before, aside)
        raise
    if run.fresh and cfg.sft_epochs > 0:
        # the policy alone computes: no customer now
        torch.set_num_threads(cfg.train_threads or cfg.threads)
        sft.cold_start(run, kit.cold_start and (lambda *a, **k: kit.cold_start(run, *a, **k)))
        torch.set_num_threads(cfg.threads)
        # saved before vLLM starts: a --resume after it refused starts after the cold start
        save(run, 0)
    # frozen: the policy RL starts from
    run.reference = reference_for(cfg, out, run.model_path, device, sharded)
    # vLLM seeds the global generators as it starts: a resumed run's are put back
    rng = ckpt.rng_state()
    run.engine, run.shares_weights = rollout_engine(engine, run.policy, run.tok, run.model_path, cfg,
                                                    device, sharded)
    ckpt.set_rng_state(rng)
    # the first push as the loop's (step 6): KV cache asleep while the weights arrive one tensor at a
    # time (fsdp.full_tensors), cast to the engine's dtype
    if not run.shares_weights:
        run.engine.sleep()
        run.engine.wake_up()
        run.engine.update_weights(full_tensors(run.policy, dtype=getattr(torch, cfg.dtype)))
    run.agent = PolicyAgent(run.engine, run.tok)
    # (a run resumed at step 0, after the cold start, evaluates it then)
    if run.start == 0 and rank == 0 and run.eval_tasks and ("cold start" if cfg.sft_epochs > 0 else "start") \
            not in run.results:
        run_eval(run, "cold start" if cfg.sft_epochs > 0 else "start")
        if kit.started:
            kit.started(run)
    return run


# --------------------------------------------------------------------------------------------------
# The loop


def train(cfg: Config, kit: Kit | None = None) -> dict:
    """The run `cfg` asks for: build_run(), one GRPO step an iteration, finish(): the results table."""
    run = build_run(cfg, kit or Kit())
    cfg, per_rank = run.cfg, run.cfg.tasks_per_step // run.world_size  # (cfg as built: dtype, rows)
    quiet = run.rank != 0  # (one progress bar, rank 0's)
    bar = tqdm(range(run.start, cfg.steps), desc="GRPO", initial=run.start, total=cfg.steps, disable=quiet)
    for step in bar:
        t0 = time.perf_counter()
        # 1. roll out: B tasks x G conversations each (every rank draws the same B, plays its share)
        tasks = run.sampler.next(cfg.tasks_per_step)[run.rank * per_rank : (run.rank + 1) * per_rank]
        run.policy.eval()
        live = tqdm(desc=f"step {step} rollout", unit="episode", leave=False, mininterval=10, disable=quiet)
        episodes = rollout(tasks, cfg.group_size, run.worlds, run.agent, run.user,
                           RolloutConfig.of(cfg, seed=episode_seed(cfg.seed, "grpo", step, run.rank)),
                           progress=lambda done, total: live.update(done - live.n))
        live.close()
        # vLLM on a GPU frees its memory for the update; HFEngine drops its cache
        run.engine.sleep()
        # 2. score: reward 1 iff the final database is the gold one
        score(episodes, run.worlds, check_outputs=cfg.train_check_outputs)
        t1 = time.perf_counter()
        run.episodes_log.write(episodes, step=step)
        # 3. advantages per group (one with an aborted episode is dropped, its task drawn again)
        kept, adv = advantages(episodes, cfg.group_size, cfg.advantage, cfg.reward, cfg.turn_bonus,
                               cfg.drop_customer_faults)
        # an aborted group's task, once, is drawn again: every rank puts back the same, in order
        lost = [{"id": t} for t in {e.group: e.task.id for e in episodes if e.aborted}.values()]
        run.sampler.put_back([r["id"] for r in all_gather_episodes(lost, run.world_size)])
        # 4 + 5. loss, backward, optimizer step (one branch on every rank: the update is collective)
        run.policy.train()
        keep = view.pick(kept, adv, cfg.group_size) if run.rank == 0 else []  # the page's groups
        if all_sum(float(sum(sum(e.mask) for e in kept)), run.world_size) > 0:
            torch.set_num_threads(cfg.train_threads or cfg.threads)  # (the customer is idle now)
            upd = update(run.policy, run.reference, kept, adv, run.opt, **update_settings(cfg),
                         world_size=run.world_size, keep=keep)
            torch.set_num_threads(cfg.threads)
        # a forward and backward over 0 trained tokens would cost a full update and change nothing
        else:
            upd = {"skipped": True, "reason": "no trained tokens (the prompt alone fills the context?)"
                   if all_sum(len(kept), run.world_size) else "every group had an aborted episode"}
            print(f"[step {step}] warning: update skipped: {upd['reason']}", flush=True)
        run.updates += not upd["skipped"]
        t2 = time.perf_counter()
        # 6. sync (none if shared): wake the engine first (asleep, vLLM gave back its weights)
        run.engine.wake_up()
        if not run.shares_weights:
            run.engine.update_weights(full_tensors(run.policy, dtype=getattr(torch, cfg.dtype)))
        t3 = time.perf_counter()
        # 7. log: the step's numbers, and every 10 steps one whole episode with its mask
        if run.rank == 0:  # and 1-2 groups token by token, as the loss saw them (view.html)
            view.record(run.out, step, kept, adv, keep, upd.pop("seen", {}), run.tok, cfg.group_size, cfg.tis_cap)
        st = step_stats(episodes, len(kept) // cfg.group_size, cfg.group_size, run.world_size)
        run.log({"phase": "grpo", "step": step, **st, **upd, "rollout_s": t1 - t0, "update_s": t2 - t1,
                 "sync_s": t3 - t2, "tokens_per_s": st["tokens"] / max(1e-9, t3 - t0),
                 "user": run.user.take_stats()})  # the customer endpoint's health (rank 0's)
        if run.rank == 0 and step % 10 == 0 and episodes:
            write_sample(run.out, step, episodes[0], run.tok)
        bar.set_postfix(reward=f"{st['reward']:.3f}", kl=f"{upd.get('kl', 0):.4f}", turns=f"{st['turns']:.1f}")
        # 8. evaluate and checkpoint. A customer that stays down stops the run: the checkpoint keeps
        # what this step trained; a step that trained nothing is played again on --resume.
        done = step + 1
        try:
            why = next((e.info.get("user_error", "") for e in episodes if e.aborted), "")
            run.user.after(f"step {step}", {"all_aborted": st["kept_groups"] == 0 < st["aborted"],
                                            "last_error": why}, run.log)
            if run.rank == 0 and run.eval_tasks and cfg.eval_every and done % cfg.eval_every == 0 \
                    and done < cfg.steps:
                run_eval(run, f"GRPO step {done}", done)
        except RunStopped:
            save(run, step + (not upd["skipped"]))
            raise
        if cfg.save_every and (done % cfg.save_every == 0 or done == cfg.steps):
            save(run, done)
    return finish(run)


def save(run, step: int) -> None:
    """A checkpoint: weights, AdamW, the task order, the results, updates made, the global step."""
    state = {"results": run.results, "updates": run.updates, "global_step": run.log.global_step}
    ckpt.save_checkpoint(run.out, step, run.policy, run.opt, run.sampler, state, run.world_size, run.rank)


def finish(run) -> dict:
    """The final evaluation, checkpoint and model; the results table."""
    cfg, n = run.cfg, run.updates
    # the label says how many steps updated the model (0: its customer failed throughout)
    label = f"GRPO ({cfg.steps} steps)" if n == cfg.steps else \
        f"GRPO ({n} of {cfg.steps} steps updated)" if n else f"not trained (0 of {cfg.steps} GRPO steps updated)"
    if run.eval_tasks and cfg.steps > run.start:
        if run.rank == 0:
            run_eval(run, label, cfg.steps)
        save(run, cfg.steps)  # every rank: under FSDP, gathering the full weights is a collective
    ckpt.save_pretrained(run.policy, run.tok, run.out / "final", run.world_size, run.rank)
    run.user.close()  # a served customer's server (also stopped at exit, on an error or Ctrl-C)
    if run.rank == 0:  # the run's record: final/muarl.json, results.md, curves.png, view.html
        write_record(run.out, label, cfg.steps, n, provenance(run.worlds), run.results, cfg.eval_trials,
                     run.user.label)
    dist_teardown(run.world_size, run.engine)  # the engine first: vLLM leaves no traceback at exit
    if cfg.steps > 0 and n == 0:
        raise RunStopped(f"no GRPO step updated the model ({cfg.steps} steps, see log.jsonl): final/ "
                         "holds it as it was before RL, labelled so in results.md and final/muarl.json")
    return run.results


def main(argv: list[str] | None = None, kit: Kit | None = None) -> dict:
    """`python muarl.py ARGS` as a function: parse, check, train."""
    cfg = parse_config(argv, Config, groups=GROUPS, prog="muarl.py")
    early(cfg)
    return train(cfg, kit)


if __name__ == "__main__":
    run_cli(lambda: train(CLI), "muarl")

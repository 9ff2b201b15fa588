"""MUA-RL training: cold-start SFT, then GRPO on live multi-turn conversations with a simulated customer.

    python muarl.py --model tiny                                   # CPU demo: builds a tiny model, SFT, GRPO, table
    python muarl.py --model Qwen/Qwen3-8B --domains retail,airline --user llm --user_model gpt-4.1 ...
    torchrun --nproc_per_node 8 muarl.py --model Qwen/Qwen3-32B ...  # FSDP2, one rollout engine per rank

The loop (MUA-RL, Zhao et al. 2025, arXiv:2508.18669, Algorithm 1), one optimizer step per iteration, is `main()`:

    1 roll out B tasks x G conversations   5 optimizer step (AdamW, grad clip; skipped if not finite)
    2 score: the final database            6 sync the new weights into the rollout engine
    3 rewards -> group advantages          7 log (JSONL + progress bar)
    4 loss and backward, packed rows       8 evaluate and checkpoint, every so often

Everything before the loop (worlds, tasks, customer, models, the cold start, the engine) is `build_run()`.
Symbols: B = tasks per step, G = group size (rollouts per task), T = tokens, N_tok = trained tokens in a step.

Departures from the paper (see also the README):
1. One update per batch, as the authors ran it: the policy that sampled is the one we update, so old_logp =
   logp.detach() (ratio == 1, the clip never fires), no second pass. Engine vs trainer log-probs: `logp_gap`.
2. `--model tiny` is the CPU demo's preset (demo.TINY): a from-scratch model, copy drills, short turns, lr 1e-4.
3. Groups with an aborted episode (the customer simulator failed) are dropped from the step, not scored 0; their
   tasks are drawn again. A customer that fails every group for longer than --user_down_s stops the run (checkpoint
   saved, exit 3), and a run that never updated says so (results.md, final/muarl.json, exit 3): preflight.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from tqdm import tqdm

import chat
import sft
from checkpoint import TaskSampler, load_checkpoint, newest_checkpoint, rng_state, save_checkpoint, save_pretrained
from checkpoint import set_aside, set_rng_state
from config import Config, ConfigError, _band, make_customer, parse_config, public, save_config, validate  # noqa: F401
from domains import load_worlds, task_sets
from domains.tau2_data import provenance
from engine import check_vllm_model, make_engine
from eval import evaluate, format_table
from fsdp import all_gather_episodes, all_sum, barrier, bf16_compute, compute_device, dist_setup, dist_teardown, shard
from fsdp import even_rows, exit_now, full_state_dict, full_tensors, is_sharded, load_sharded, reduce_stats  # noqa
from grpo import ADVANTAGES, REWARDS, grpo_loss, pack_sequences, token_advantages, token_logprobs
from models import GIB, build_or_load_model, describe, load_policy, load_reference
from preflight import RunStopped, prompt_warning
from rollout import PolicyAgent, RolloutConfig, TrajectoryLog, rollout, score
from runlog import RunLog, step_stats  # noqa: F401  (muarl.step_stats: tests call it)
from sampling import episode_seed

# ---------------------------------------------------------------------------------------------------------------
# 3 + 4 + 5. Advantages and the update


def advantages(episodes, G: int, estimator: str = "grpo", reward: str = "outcome", turn_bonus: float = 0.0,
               drop_faults: bool = False) -> tuple[list, list]:
    """Training rewards (grpo.REWARDS[reward]) -> advantages, group by group (grpo.ADVANTAGES[estimator]). Groups
    holding an aborted episode are dropped (with `drop_faults`, also those whose customer provably broke its
    instructions). Returns (kept episodes, their advantages: a number or a per-token list each)."""
    keep, adv = [], []
    for g in range(0, len(episodes), G):
        group = episodes[g : g + G]
        if any(e.aborted or drop_faults and e.info.get("customer_mistakes") for e in group):
            continue
        A = ADVANTAGES[estimator](torch.tensor([float(REWARDS[reward](e)) for e in group]), G).tolist()  # (G,)
        adv += [token_advantages(a, e.spans, len(e.ids), turn_bonus) for e, a in zip(group, A)]
        keep += group
    return keep, adv


def update(policy, reference, episodes, advantages, opt, *, row_tokens: int, chunk: int, bf16: bool, kl_coef: float,
           clip: tuple[float, float], sampler: tuple[float, float], grad_clip: float, world_size: int = 1) -> dict:
    """One optimizer step of GRPO on this rank's episodes: pack -> log-probs -> loss -> backward -> step.

    The step's loss is the token mean over every trained token of every rank's episodes; each packed row (of at most
    `row_tokens`) adds its share (masked sum / N_tok) to the gradient, so splitting into rows changes nothing. With
    `bf16` the forward computes in bf16 while AdamW updates fp32 weights (fsdp.bf16_compute). `sampler`: the
    engine's (temperature, top-p), to compare like for like (logp_gap); `clip`: (low, high)."""
    rows = pack_sequences([e.ids for e in episodes], [e.mask for e in episodes], row_tokens,
                          adv=advantages, sample_logp=[e.logprobs for e in episodes])
    rows = even_rows(rows, world_size)  # FSDP: every rank runs as many rows (one process: unchanged)
    n_tok = all_sum(float(sum(sum(e.mask) for e in episodes)), world_size)  # N_tok of the whole step
    # The forward pass is grpo.token_logprobs(model, ...). Under FSDP it runs as a registered forward method of the
    # sharded model (fsdp.shard), so the model's root gathers its weights around it.
    logprobs = (lambda m, *a, **k: m.token_logprobs(*a, **k)) if is_sharded(policy) else token_logprobs
    dev = compute_device(policy)  # rows are packed on the CPU: they go to the GPU
    use_ref = reference is not None and kl_coef > 0
    opt.zero_grad(set_to_none=True)
    stats = []
    for row in rows:
        row = {k: v.to(dev) for k, v in row.items()}  # every tensor the loss meets, not just the forward's inputs
        ids, pos, mask = row["input_ids"], row["position_ids"], row["mask"]  # (1, L) each
        with bf16_compute(policy, bf16):  # the forward in bf16 (fp32 log-softmax inside); backward outside
            with torch.no_grad():  # (1, L): the frozen reference's log-probs, for the KL term
                ref_logp = logprobs(reference, ids, position_ids=pos, chunk_size=chunk) if use_ref else None
            # logp_seen: these tokens' log-probs under the distribution the engine drew them from (temperature, top-p)
            logp, ent, logp_seen = logprobs(policy, ids, position_ids=pos, chunk_size=chunk, return_entropy=True,
                                            sampler=sampler)
        old_logp = logp.detach()  # one update per batch: the sampling policy is this policy (departure 1)
        loss, st = grpo_loss(logp, old_logp, ref_logp, row["adv"], mask, *clip, kl_coef, num_tokens=max(n_tok, 1.0),
                             entropy=ent)
        loss.backward()
        # engine vs trainer, like for like; clamped: a token outside the trainer's nucleus is -inf (masked or not)
        gap = ((row["sample_logp"] - logp_seen).abs().clamp(max=1e3) * mask).sum().item()
        stats.append({**st, "loss": loss.item(), "logp_gap": gap})
    gnorm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip))
    out = reduce_stats(stats, world_size)  # token-weighted means over every row of every rank
    finite = math.isfinite(out["loss"]) and math.isfinite(gnorm)
    if finite:
        opt.step()
    opt.zero_grad(set_to_none=True)
    return {**out, "grad_norm": gnorm, "skipped": not finite, "trained_tokens": n_tok}


def update_settings(cfg: Config) -> dict:
    """The run's flags as update() takes them."""
    return dict(row_tokens=cfg.micro_batch_tokens, chunk=cfg.logprob_chunk, bf16=cfg.dtype == "bfloat16",
                kl_coef=cfg.kl_coef, clip=(cfg.clip_low, cfg.clip_high), sampler=(cfg.temperature, cfg.top_p),
                grad_clip=cfg.grad_clip)


# ---------------------------------------------------------------------------------------------------------------
# Setup: everything before the loop


def rollout_cfg(cfg: Config, greedy: bool = False, seed: int | None = None) -> RolloutConfig:
    return RolloutConfig(max_turns=cfg.max_turns, max_context=cfg.max_context, max_new_tokens=cfg.max_new_tokens,
                         temperature=0.0 if greedy else cfg.temperature, top_p=cfg.top_p, seed=seed,
                         tools_in_prompt=cfg.tools_in_prompt, malformed=cfg.malformed)


def run_eval(run, name: str, step: int = 0, model=None, trials: int | None = None) -> None:
    """pass^1..k (k = --eval_trials, the agent greedy) on the held-out tasks (rank 0) of the model after GRPO step
    `step` (or of `model`: the untrained one, from disk), logged with the global step and kept for the table."""
    engine = make_engine("hf", model=model, tokenizer=run.tok) if model is not None else \
        run.engine or make_engine("hf", model=run.policy, tokenizer=run.tok)  # before the engine exists: the policy
    k = trials or run.cfg.eval_trials
    m, eps = evaluate(run.eval_tasks, run.worlds, PolicyAgent(engine, run.tok), run.user,
                      rollout_cfg(run.cfg, greedy=True, seed=run.cfg.seed), trials=k, progress=False)
    run.episodes_log.write(eps, phase="eval", name=name)
    run.results[name] = m
    run.log({"phase": "eval", "name": name, "step": step, **m, "user": run.user.take_stats()})
    extra = f", pass^{k} {100 * m[f'pass^{k}']:.1f}%" if k > 1 else ""
    fid = f"; customer fidelity {100 * m['customer_fidelity']:.1f}%" if "customer_fidelity" in m else ""
    print(f"[eval] {name}: pass^1 {100 * m['pass^1']:.1f}%{extra} over {len(run.eval_tasks)} held-out tasks x {k}{fid}",
          flush=True)
    run.user.after(name, m, run.log)  # (a served customer: its gate held on these conversations, a dead server back)


def cold_start(run) -> None:
    """0. The cold start: SFT on expert conversations (copy drills first for the from-scratch tiny model)."""
    cfg = run.cfg
    common = {"world_size": run.world_size, "rank": run.rank, "seed": cfg.seed, "bf16": cfg.dtype == "bfloat16",
              "micro_batch_tokens": cfg.micro_batch_tokens, "chunk_size": cfg.logprob_chunk}
    convs = sft.load_jsonl(cfg.sft_data) if cfg.sft_data else sft.expert_conversations(run.train_tasks)
    if not convs:
        raise ConfigError("cold start needs conversations: generated tasks or --sft_data")
    if cfg.model == "tiny" and cfg.copy_warmup > 0:  # a random model cannot copy yet: drills first (demo's kit)
        from demo.drills import copy_warmup, until_lookup, words_of
        copy_warmup(run.policy, run.tok, cfg.copy_warmup, cfg.copy_lr, words_of(run.train_tasks), log=run.log, **common)
    convs = [dict(c, tools=[]) for c in convs] if not cfg.tools_in_prompt else convs
    tiny = cfg.model == "tiny" and cfg.copy_warmup > 0  # SFT until the store's probes take (up to --lookup_draws)
    ((lambda *a, **k: until_lookup(run, *a, **k)) if tiny else sft.train)(  # takes (demo's kit); one that fails: named
        run.policy, sft.render_examples(run.tok, convs, run.worlds), epochs=cfg.sft_epochs, batch_size=cfg.sft_batch,
        lr=cfg.sft_lr, log=run.log, **common)
    save_pretrained(run.policy, run.tok, run.out / "cold-start", run.world_size, run.rank)  # a collective


def build_run(cfg: Config) -> SimpleNamespace:
    """Worlds, tasks, customer (all that can fail on bad input fails first), then the policy, the cold start, the
    frozen reference and the rollout engine. Returns the run's state as one namespace."""
    rank, world_size = dist_setup(cfg.offload)
    validate(cfg, world_size)
    on_gpu, sharded = torch.cuda.is_available(), torch.distributed.is_initialized()  # torchrun: FSDP2, even 1 rank
    device = f"cuda:{torch.cuda.current_device()}" if on_gpu else "cpu"
    on_gpu = on_gpu or cfg.plan > 0  # --plan plans a GPU run (bf16, vLLM, 16,384 tokens) wherever it is asked
    dtype = ("bfloat16" if on_gpu else "float32") if cfg.dtype == "auto" else cfg.dtype  # compute; masters are fp32
    engine_kind = ("vllm" if on_gpu else "hf") if cfg.engine == "auto" else cfg.engine
    # 0 = by device: the paper's 16,384 on a GPU; on a CPU 7,000 (issue 15: 44 s / 2.1 GB an update, 180 s / 5.7 GB)
    cfg = dataclasses.replace(cfg, micro_batch_tokens=cfg.micro_batch_tokens or (16384 if on_gpu else 7000),
                              dtype=dtype, threads=cfg.threads or torch.get_num_threads())  # 0: torch's own count
    torch.set_num_threads(cfg.threads)
    if cfg.plan or (on_gpu and rank == 0):  # the memory plan, before any work (models.py): --plan N prints and exits
        gib = torch.cuda.mem_get_info()[1] / GIB if torch.cuda.is_available() else 80.0
        print(describe(cfg.model, cfg.plan or world_size, cfg.micro_batch_tokens, cfg.activation_checkpointing,
                       cfg.kl_coef > 0, dtype == "bfloat16", cfg.logprob_chunk, engine_kind, cfg.engine_memory, gib,
                       sharded, cfg.offload), flush=True)
        if cfg.plan:
            raise SystemExit(0)
    if engine_kind == "vllm" and cfg.model != "tiny":  # a model vLLM cannot run: say so now, not after SFT
        check_vllm_model(cfg.model, on_cpu=not on_gpu)
    out = Path(cfg.out_dir)
    ckpt = newest_checkpoint(out) if cfg.resume else None  # --resume: the newest whole checkpoint, or one line
    random.seed(cfg.seed + rank)
    np.random.seed(cfg.seed + rank)
    torch.manual_seed(cfg.seed)  # the same on every rank: a tiny model is initialised identically everywhere
    worlds = load_worlds(cfg)
    train_tasks, eval_tasks = task_sets(cfg, worlds)
    if not train_tasks:
        raise ConfigError(f"no training tasks in {cfg.domains}")
    held_out = eval_tasks[: cfg.eval_tasks or None]
    # Every input is checked before anything is written (a bad flag, missing data, an endpoint leave out_dir as it was):
    # the customer checks what it can now (an endpoint: preflight; a served model: vLLM, its folder), starts later
    user = make_customer(cfg, out)
    user.check(train_tasks + held_out)
    # Only then is an earlier run set aside (previous-<k>/: never appended to nor overwritten, checkpoint.py)
    out.mkdir(parents=True, exist_ok=True)
    if ckpt is None and rank == 0 and (aside := set_aside(out)):
        print(f"muarl: the earlier run in {out} is kept in {aside}", flush=True)
    barrier(world_size)
    log = RunLog(out / "log.jsonl", rank, cfg.logger, public(cfg))  # one global step; strict JSON; no secrets
    user.start(train_tasks + held_out, log)  # a served model is served and gated now: below its gate the run stops
    if rank == 0:
        save_config(out, cfg)  # a changed configuration keeps the previous file beside it (config.py)
    for source in provenance(worlds):  # where the tau2 data came from, printed and logged
        print(f"[data] {source['domain']}: {source['path']} (sha256 {source['sha256']}; {source['revision']})")
        log({"phase": "data", **source})
    policy, tok, model_path = build_or_load_model(cfg, worlds, out, device, dtype, rank, world_size, sharded)
    if rank == 0 and (warn := prompt_warning(tok, worlds, cfg.max_context, cfg.max_new_tokens, cfg.tools_in_prompt)):
        print(warn, flush=True)
    run = SimpleNamespace(cfg=cfg, rank=rank, world_size=world_size, out=out, log=log, worlds=worlds, user=user,
                          train_tasks=train_tasks, eval_tasks=held_out if cfg.eval else [],
                          policy=policy, tok=tok, engine=None, results={}, sampler=TaskSampler(train_tasks, cfg.seed),
                          episodes_log=TrajectoryLog(out / f"episodes-rank{rank}.jsonl"))
    fresh = ckpt is None
    if fresh and rank == 0 and run.eval_tasks and cfg.sft_epochs and not cfg.copy_warmup and not (sharded and on_gpu):
        # rank 0 (FSDP2 on a CPU: a whole copy from disk; GPUs: none); not random weights awaiting drills (0.0 %, 88 s)
        run_eval(run, "untrained", model=load_policy(model_path)[0] if sharded else None, trials=1)
    if not sharded and cfg.activation_checkpointing:  # (under torchrun, load_sharded sharded the policy with FSDP2)
        policy.gradient_checkpointing_enable()
    run.opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)  # fp32: as the masters
    run.start, state = load_checkpoint(out, policy, run.opt, run.sampler, world_size, ckpt) if ckpt else (0, {})
    run.results.update(state.get("results", {}))
    run.updates, log.global_step = state.get("updates", run.start), state.get("global_step", 0)  # both go on
    if fresh and cfg.sft_epochs > 0:
        torch.set_num_threads(cfg.train_threads or cfg.threads)  # the policy alone computes: no customer beside it
        cold_start(run)
        torch.set_num_threads(cfg.threads)

    # The frozen reference: the policy as RL starts (after the cold start, else the model itself), as in the paper,
    # read from disk in the compute dtype (bf16 on a GPU: it never trains); under FSDP2 each rank reads its shards.
    run.reference = None
    if cfg.kl_coef > 0:
        start = str(out / "cold-start" if (out / "cold-start").exists() else model_path)
        run.reference = load_sharded(start, getattr(torch, dtype), bf16=dtype == "bfloat16", frozen=True,
                                     offload=cfg.offload) if sharded \
            else load_reference(start, dtype=dtype, device=device)

    # the rollout engine: on one process "hf" shares the policy's weights; vLLM (or FSDP) keeps its own copy
    run.shares_weights = engine_kind == "hf" and not sharded
    rng = rng_state()  # vLLM seeds the global generators as it starts: a resumed run's restored ones are put back
    if run.shares_weights:
        run.engine = make_engine("hf", model=policy, tokenizer=tok)
    elif engine_kind == "hf":
        run.engine = make_engine("hf", model=load_policy(model_path, dtype=dtype, device=device)[0], tokenizer=tok)
    else:  # on a GPU, vLLM shares the device with the trainer: it sleeps through each update
        run.engine = make_engine("vllm", model_path=model_path, tokenizer=tok, enable_sleep_mode=True, seed=cfg.seed,
                                 gpu_memory_utilization=cfg.engine_memory)
    set_rng_state(rng)
    if not run.shares_weights:  # one tensor at a time (fsdp.full_tensors), cast to the engine's dtype
        run.engine.update_weights(full_tensors(policy, dtype=getattr(torch, dtype)))
    run.agent = PolicyAgent(run.engine, tok)
    if fresh and rank == 0 and run.eval_tasks:
        run_eval(run, "cold start" if cfg.sft_epochs > 0 else "start")
        band, p1 = _band(cfg.stage_band), run.results[next(reversed(run.results))]["pass^1"]
        if band and not band[0] <= p1 <= band[1]:  # not the start the run expects: named now, not in the last table
            print(f"[stage] the cold start's held-out pass^1 {100 * p1:.1f} % is outside --stage_band {cfg.stage_band}")
            run.log({"phase": "stage", "stage": "cold_start", "pass^1": p1, "ok": False})
    return run


# ---------------------------------------------------------------------------------------------------------------
# The loop


def main(argv: list[str] | None = None) -> dict:
    run = build_run(parse_config(argv))
    cfg = run.cfg  # as built: micro_batch_tokens resolved by device
    per_rank = cfg.tasks_per_step // run.world_size
    bar = tqdm(range(run.start, cfg.steps), desc="GRPO", initial=run.start, total=cfg.steps, disable=run.rank != 0)
    for step in bar:
        t0 = time.perf_counter()
        # 1. roll out: B tasks (every rank draws the same B and plays its share) x G conversations each
        tasks = run.sampler.next(cfg.tasks_per_step)[run.rank * per_rank : (run.rank + 1) * per_rank]
        run.policy.eval()
        live = tqdm(desc=f"step {step} rollout", unit="episode", leave=False, mininterval=10, disable=run.rank != 0)
        episodes = rollout(tasks, cfg.group_size, run.worlds, run.agent, run.user,  # the bar: finished episodes
                           rollout_cfg(cfg, seed=episode_seed(cfg.seed, "grpo", step, run.rank)),
                           progress=lambda done, total: live.update(done - live.n))
        live.close()
        run.engine.sleep()  # vLLM on a GPU frees its memory for the update; HFEngine drops its stored keys/values
        # 2. score: reward 1 iff the final database is the gold one
        score(episodes, run.worlds, check_outputs=cfg.train_check_outputs)
        t1 = time.perf_counter()
        run.episodes_log.write(episodes, step=step)
        # 3. advantages, group by group (groups with an aborted episode are dropped, their tasks drawn again)
        kept, adv = advantages(episodes, cfg.group_size, cfg.advantage, cfg.reward, cfg.turn_bonus,
                               cfg.drop_customer_faults)
        lost = [{"id": t} for t in {e.group: e.task.id for e in episodes if e.aborted}.values()]  # one per group
        run.sampler.put_back([r["id"] for r in all_gather_episodes(lost, run.world_size)])  # every rank, same order
        # 4 + 5. loss, backward, optimizer step (every rank takes the same branch: the update is collective)
        run.policy.train()
        if all_sum(float(sum(sum(e.mask) for e in kept)), run.world_size) > 0:
            torch.set_num_threads(cfg.train_threads or cfg.threads)  # (--train_threads: the customer is idle now)
            upd = update(run.policy, run.reference, kept, adv, run.opt, **update_settings(cfg),
                         world_size=run.world_size)
            torch.set_num_threads(cfg.threads)
        else:  # a forward and backward over 0 trained tokens would cost a full update and change nothing
            upd = {"skipped": True, "reason": "no trained tokens (the prompt alone fills the context?)"
                   if all_sum(len(kept), run.world_size) else "every group had an aborted episode"}
            print(f"[step {step}] warning: update skipped: {upd['reason']}", flush=True)
        run.updates += not upd["skipped"]
        t2 = time.perf_counter()
        # 6. sync: the engine wakes first (asleep, vLLM has handed its weights' memory back); no copy if it shares them
        run.engine.wake_up()
        if not run.shares_weights:
            run.engine.update_weights(full_tensors(run.policy, dtype=getattr(torch, cfg.dtype)))
        t3 = time.perf_counter()
        # 7. log: the step's numbers, and every 10 steps one whole episode with its mask
        st = step_stats(episodes, len(kept) // cfg.group_size, cfg.group_size, run.world_size)
        run.log({"phase": "grpo", "step": step, **st, **upd, "rollout_s": t1 - t0, "update_s": t2 - t1,
                 "sync_s": t3 - t2, "tokens_per_s": st["tokens"] / max(1e-9, t3 - t0),
                 "user": run.user.take_stats()})  # the customer endpoint's health (rank 0's)
        if run.rank == 0 and step % 10 == 0 and episodes:
            e = episodes[0]
            with open(run.out / "samples.txt", "a") as f:
                f.write(f"=== step {step}  task {e.task.id}  reward {e.reward}  stop {e.stop_reason}  "
                        f"(trained tokens in [[...]])\n{chat.show_mask(run.tok, e.ids, e.mask)}\n\n")
        bar.set_postfix(reward=f"{st['reward']:.3f}", kl=f"{upd.get('kl', 0):.4f}", turns=f"{st['turns']:.1f}")
        # 8. evaluate and checkpoint. A customer that stays down (or a served one that will not restart) stops the run:
        # the checkpoint keeps what this step trained; a step that trained nothing is played again on --resume.
        done = step + 1
        try:
            run.user.after(f"step {step}", {"all_aborted": st["kept_groups"] == 0 < st["aborted"], "last_error": next(
                (e.info.get("user_error", "") for e in episodes if e.aborted), "")}, run.log)
            if run.rank == 0 and cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps and run.eval_tasks:
                run_eval(run, f"GRPO step {done}", done)
        except RunStopped:
            save_checkpoint(run.out, step + (not upd["skipped"]), run.policy, run.opt, run.sampler, state(run),
                            run.world_size, run.rank)
            raise
        if cfg.save_every and (done % cfg.save_every == 0 or done == cfg.steps):
            save_checkpoint(run.out, done, run.policy, run.opt, run.sampler, state(run), run.world_size, run.rank)
    return finish(run)


def state(run) -> dict:
    """What a checkpoint keeps beyond weights and sampler: the results table, updates made, the global step."""
    return {"results": run.results, "updates": run.updates, "global_step": run.log.global_step}


def finish(run) -> dict:
    """The final evaluation, checkpoint and model; the results table."""
    cfg, n = run.cfg, run.updates
    # the label says how many steps really updated the model: a run whose customer failed throughout is not "trained"
    label = f"GRPO ({cfg.steps} steps)" if n == cfg.steps else f"GRPO ({n} of {cfg.steps} steps updated)" if n else \
        f"not trained (0 of {cfg.steps} GRPO steps updated)"
    if run.eval_tasks and cfg.steps > run.start:
        if run.rank == 0:
            run_eval(run, label, cfg.steps)
        # every rank: under FSDP, gathering the full weights for the checkpoint is a collective
        save_checkpoint(run.out, cfg.steps, run.policy, run.opt, run.sampler, state(run), run.world_size, run.rank)
    save_pretrained(run.policy, run.tok, run.out / "final", run.world_size, run.rank)
    run.user.close()  # a served customer's server (also stopped at exit, on an error or Ctrl-C: serve.ModelServer)
    if run.rank == 0:
        from demo import curves
        curves.draw(run.out)  # runs/<name>/curves.png: the training dynamics (needs matplotlib; else one line)
        (run.out / "final" / "muarl.json").write_text(json.dumps({"model": label, "grpo_steps": cfg.steps,
                                                                  "updates": n, "data": provenance(run.worlds)}))
    if run.rank == 0 and run.results:
        table = format_table(list(run.results.items()), cfg.eval_trials)
        (run.out / "results.md").write_text(table + "\n")
        print(f"\nHeld-out success (greedy agent, customer: {run.user.label}, {cfg.eval_trials} trial(s) per task)\n"
              f"{table}")
    dist_teardown(run.world_size)
    if cfg.steps > 0 and n == 0:
        raise RunStopped(f"no GRPO step updated the model ({cfg.steps} steps, see log.jsonl): final/ holds it as it "
                         "was before RL, labelled so in results.md and final/muarl.json")
    return run.results


if __name__ == "__main__":
    try:
        main()
        exit_now(int(os.environ.get("WORLD_SIZE", 1)))  # under torchrun: leave before gloo's exit-time abort
    except (ImportError, OSError, ValueError) as e:  # bad input (ConfigError, PreflightError, ServeError): 1 line
        print(f"muarl: {'config error: ' if isinstance(e, ConfigError) else ''}{e}", file=sys.stderr)
        sys.exit(2)
    except RunStopped as e:  # stopped on purpose, checkpoint saved (the customer is down; nothing trained): 3
        print(f"muarl: {e}", file=sys.stderr)
        sys.exit(3)

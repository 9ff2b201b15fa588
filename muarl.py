"""MUA-RL training: a cold start on expert conversations, then GRPO on live conversations with a customer.

    python muarl.py --model Qwen/Qwen3-8B --user_model gpt-4o-2024-11-20       # the paper's recipe, one process
    torchrun --nproc_per_node 8 muarl.py --model Qwen/Qwen3-8B --user_serve /models/Qwen3-32B   # FSDP2
    python -m demo                                       # the CPU demo: a tiny model learns on a laptop

The loop (MUA-RL, Zhao et al. 2025, arXiv:2508.18669, Algorithm 1), one optimizer step per
iteration, is `train()`:

    1 roll out B tasks x G conversations   5 optimizer step (AdamW, grad clip; skipped if not finite)
    2 score: the final database            6 sync the new weights into the rollout engine
    3 rewards -> group advantages          7 log (JSONL + progress bar)
    4 loss and backward, packed rows       8 evaluate and checkpoint, every so often

Everything before the loop (worlds, tasks, customer, models, the cold start, the engine) is
`build_run()`. A variant plugs its own pieces in through a `Kit` (the CPU demo's builds its tiny
model and drills it). Symbols: B = tasks per step, G = group size (rollouts per task), T = tokens,
N_tok = trained tokens in a step.

Departures from the paper (see also the README):
1. One update per batch, as the authors ran it: the policy that sampled is the one we update, so
   old_logp = logp.detach() (ratio == 1, the clip never fires), no second pass. Engine vs trainer
   log-probs: `logp_gap`.
2. Groups with an aborted episode (the customer's endpoint failed) are dropped from the step, not
   scored 0; their tasks are drawn again. A customer down for longer than --user_down_s stops the
   run (exit 3).
"""

from __future__ import annotations

import sys

from config import GROUPS, Config
from plumbing.flags import ConfigError, parse_config
from plumbing.validate import early

# the command line first: --help and a bad flag answer before torch loads
if __name__ == "__main__":
    try:
        CLI = parse_config(None, Config, groups=GROUPS, prog="muarl.py")
        early(CLI)
    except ConfigError as e:
        print(f"muarl: config error: {e}", file=sys.stderr)
        sys.exit(2)

import dataclasses  # noqa: E402  (the imports a run needs, after the command line is known to be good)
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import chat  # noqa: E402
import sft  # noqa: E402
from domains import load_worlds, task_sets  # noqa: E402
from domains.tau2_data import provenance  # noqa: E402
from engine import check_vllm_model, make_engine  # noqa: E402
from eval import evaluate, format_table  # noqa: E402
from grpo import ADVANTAGES, REWARDS, grpo_loss, pack_sequences, token_advantages, token_logprobs  # noqa: E402
from plumbing import checkpoint as ckpt, curves  # noqa: E402
from plumbing.flags import save_config, public  # noqa: E402
from plumbing.fsdp import (all_gather_episodes, all_sum, barrier, bf16_compute, compute_device,  # noqa: E402
                           dist_setup, dist_teardown, even_rows, exit_now, full_tensors, is_sharded, load_sharded,
                           reduce_stats, reshard)
from plumbing.memory_plan import GIB, describe  # noqa: E402
from plumbing.models import build_or_load_model, load_policy, load_reference  # noqa: E402
from plumbing.preflight import RunStopped, prompt_warning  # noqa: E402
from plumbing.runlog import RunLog, step_stats  # noqa: E402
from plumbing.sampling import episode_seed  # noqa: E402
from plumbing.serve import customer_for  # noqa: E402
from plumbing.validate import validate  # noqa: E402
from rollout import PolicyAgent, RolloutConfig, TrajectoryLog, rollout, score  # noqa: E402


@dataclass
class Kit:
    """What a variant of the run plugs in; None (or True) is the core's own. The CPU demo's (demo/train.py) builds
    a tiny model, drills it before the cold start, probes the cold start, serves and gates its customer model."""

    # (cfg, worlds, out) -> folder: makes the policy; else --model is it
    build_model: Callable | None = None
    # (cfg, out, rank, world_size) -> User; else plumbing.serve.customer_for
    customer: Callable | None = None
    # (run, model, examples, **sft.train's arguments) -> losses; else sft.train
    cold_start: Callable | None = None
    eval_untrained: bool = True  # evaluate the model as loaded, before the cold start
    started: Callable | None = None  # (run) -> None, once the evaluation RL starts from is done


# -------------------------------------------------------------------------------------------------------------
# 3 + 4 + 5. Advantages and the update


def advantages(episodes, G: int, estimator: str = "grpo", reward: str = "outcome", turn_bonus: float = 0.0,
               drop_faults: bool = False) -> tuple[list, list]:
    """Training rewards (grpo.REWARDS[reward]) -> advantages, group by group (grpo.ADVANTAGES[estimator]). Groups
    holding an aborted episode are dropped (with `drop_faults`, also those whose customer provably
    broke its
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


def update(policy, reference, episodes, advantages, opt, *, row_tokens: int, chunk: int, bf16: bool,
           kl_coef: float, clip: tuple[float, float], sampler: tuple[float, float], grad_clip: float,
           world_size: int = 1) -> dict:
    """One optimizer step of GRPO on this rank's episodes: pack -> log-probs -> loss -> backward -> step.

    The step's loss is the token mean over every trained token of every rank's episodes; each packed
    row (of at most `row_tokens`; a longer episode gets a row of its own, counted as `long_rows`)
    adds its share (masked sum / N_tok) to the gradient, so splitting into rows changes nothing.
    With `bf16` the forward computes in bf16
    while AdamW updates fp32 weights. `sampler`: the engine's (temperature, top-p), to compare like for like."""
    rows = pack_sequences([e.ids for e in episodes], [e.mask for e in episodes], row_tokens,
                          adv=advantages, sample_logp=[e.logprobs for e in episodes])
    # FSDP: every rank runs as many rows (one process: unchanged)
    rows = even_rows(rows, world_size)
    # N_tok of the whole step
    n_tok = all_sum(float(sum(sum(e.mask) for e in episodes)), world_size)
    # Under FSDP the forward runs as a registered method of the sharded model, so its root gathers
    # its weights.
    logprobs = (lambda m, *a, **k: m.token_logprobs(*a, **k)) if is_sharded(policy) else token_logprobs
    dev = compute_device(policy)  # rows are packed on the CPU: they go to the GPU
    use_ref = reference is not None and kl_coef > 0
    opt.zero_grad(set_to_none=True)
    stats = []
    for row in rows:
        # every tensor the loss meets, not just the forward's inputs
        row = {k: v.to(dev) for k, v in row.items()}
        ids, pos, mask = row["input_ids"], row["position_ids"], row["mask"]  # (1, L) each
        # the forward in bf16 (fp32 log-softmax inside); backward outside
        with bf16_compute(policy, bf16):
            with torch.no_grad():  # (1, L): the frozen reference's log-probs, for the KL term
                ref_logp = logprobs(reference, ids, position_ids=pos, chunk_size=chunk) if use_ref else None
            if use_ref:
                # FSDP2 keeps a root gathered after a forward no backward follows
                reshard(reference)
            # logp_seen: these tokens' log-probs under the distribution the engine drew them from
            logp, ent, logp_seen = logprobs(policy, ids, position_ids=pos, chunk_size=chunk,
                                            return_entropy=True, sampler=sampler)
        # one update per batch: the sampling policy is this policy (departure 1)
        old_logp = logp.detach()
        loss, st = grpo_loss(logp, old_logp, ref_logp, row["adv"], mask, *clip, kl_coef,
                             num_tokens=max(n_tok, 1.0), entropy=ent)
        loss.backward()
        # engine vs trainer, like for like; clamped: a token outside the trainer's nucleus is -inf
        gap = ((row["sample_logp"] - logp_seen).abs().clamp(max=1e3) * mask).sum().item()
        stats.append({**st, "loss": loss.item(), "logp_gap": gap})
    gnorm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip))
    out = reduce_stats(stats, world_size)  # token-weighted means over every row of every rank
    finite = math.isfinite(out["loss"]) and math.isfinite(gnorm)
    if finite:
        opt.step()
    opt.zero_grad(set_to_none=True)
    long_rows = all_sum(float(sum(len(e.ids) > row_tokens for e in episodes)), world_size)
    return {**out, "grad_norm": gnorm, "skipped": not finite, "trained_tokens": n_tok, "long_rows": long_rows}


def update_settings(cfg: Config) -> dict:
    """The run's flags as update() takes them."""
    return dict(row_tokens=cfg.micro_batch_tokens, chunk=cfg.logprob_chunk, bf16=cfg.dtype == "bfloat16",
                kl_coef=cfg.kl_coef, clip=(cfg.clip_low, cfg.clip_high), sampler=(cfg.temperature, cfg.top_p),
                grad_clip=cfg.grad_clip)


# -------------------------------------------------------------------------------------------------------------
# Setup: everything before the loop


def rollout_cfg(cfg: Config, greedy: bool = False, seed: int | None = None) -> RolloutConfig:
    return RolloutConfig(max_turns=cfg.max_turns, max_context=cfg.max_context, max_new_tokens=cfg.max_new_tokens,
                         temperature=0.0 if greedy else cfg.temperature, top_p=cfg.top_p, seed=seed,
                         tools_in_prompt=cfg.tools_in_prompt, malformed=cfg.malformed)


def run_eval(run, name: str, step: int = 0, model=None, trials: int | None = None) -> None:
    """pass^1..k (k = --eval_trials, the agent greedy) on the held-out tasks (rank 0) of the model after GRPO
    step `step` (or of `model`: the untrained one, from disk), logged with the global step."""
    engine = make_engine("hf", model=model, tokenizer=run.tok) if model is not None else \
        run.engine or make_engine("hf", model=run.policy, tokenizer=run.tok)  # before the engine: the policy
    k = trials or run.cfg.eval_trials
    m, eps = evaluate(run.eval_tasks, run.worlds, PolicyAgent(engine, run.tok), run.user,
                      rollout_cfg(run.cfg, greedy=True, seed=run.cfg.seed), trials=k, progress=False)
    run.episodes_log.write(eps, phase="eval", name=name)
    run.results[name] = m
    run.log({"phase": "eval", "name": name, "step": step, **m, "user": run.user.take_stats()})
    extra = f", pass^{k} {100 * m[f'pass^{k}']:.1f}%" if k > 1 else ""
    fid = f"; customer fidelity {100 * m['customer_fidelity']:.1f}%" if "customer_fidelity" in m else ""
    print(f"[eval] {name}: pass^1 {100 * m['pass^1']:.1f}%{extra} over {len(run.eval_tasks)} held-out tasks "
          f"x {k}{fid}", flush=True)
    # (a served customer: a dead server restarted; the demo's gate held)
    run.user.after(name, m, run.log)


def cold_start(run, kit: Kit) -> None:
    """0. The cold start: SFT on expert conversations, the loss on the agent's tokens only (sft.py)."""
    cfg = run.cfg
    common = {"world_size": run.world_size, "rank": run.rank, "seed": cfg.seed, "bf16": cfg.dtype == "bfloat16",
              "micro_batch_tokens": cfg.micro_batch_tokens, "chunk_size": cfg.logprob_chunk}
    convs = sft.conversations(cfg.sft_data, run.train_tasks, seed=cfg.seed)
    if not convs:
        raise ConfigError(f"--sft_data {cfg.sft_data}: no conversations for the cold start")
    convs = [dict(c, tools=[]) for c in convs] if not cfg.tools_in_prompt else convs
    (kit.cold_start and (lambda *a, **k: kit.cold_start(run, *a, **k)) or sft.train)(
        run.policy, sft.render_examples(run.tok, convs, run.worlds), epochs=cfg.sft_epochs, batch_size=cfg.sft_batch,
        lr=cfg.sft_lr, log=run.log, **common)
    # a collective
    ckpt.save_pretrained(run.policy, run.tok, run.out / "cold-start", run.world_size, run.rank)


def build_run(cfg: Config, kit: Kit) -> SimpleNamespace:
    """Worlds, tasks, customer (all that can fail on bad input fails first), then the policy, the cold start, the
    frozen reference and the rollout engine. Returns the run's state as one namespace. A start that
    fails before
    anything trained leaves the output folder as it found it (plumbing/checkpoint.undo_start)."""
    rank, world_size = dist_setup(cfg.offload)
    validate(cfg, world_size, model_given=kit.build_model is None)
    # torchrun: FSDP2, even 1 rank
    on_gpu, sharded = torch.cuda.is_available(), torch.distributed.is_initialized()
    device = f"cuda:{torch.cuda.current_device()}" if on_gpu else "cpu"
    # --plan plans a GPU run (bf16, vLLM, 16,384 tokens) wherever it is asked
    on_gpu = on_gpu or cfg.plan > 0
    # compute; masters fp32
    dtype = ("bfloat16" if on_gpu else "float32") if cfg.dtype == "auto" else cfg.dtype
    engine_kind = ("vllm" if on_gpu else "hf") if cfg.engine == "auto" else cfg.engine
    cfg = dataclasses.replace(cfg, micro_batch_tokens=cfg.micro_batch_tokens or (16384 if on_gpu else 7000),
                              # 0: torch's own count
                              dtype=dtype, threads=cfg.threads or torch.get_num_threads())
    torch.set_num_threads(cfg.threads)
    # the memory plan, before any work: --plan N prints it and exits
    if cfg.plan or (on_gpu and rank == 0):
        gib = torch.cuda.mem_get_info()[1] / GIB if torch.cuda.is_available() else 80.0
        print(describe(cfg, cfg.plan or world_size, engine_kind, gib, sharded), flush=True)
        if cfg.plan:
            raise SystemExit(0)
    # a model vLLM cannot run: said now, not after SFT
    if engine_kind == "vllm" and kit.build_model is None:
        check_vllm_model(cfg.model, on_cpu=not on_gpu)
    out = Path(cfg.out_dir)
    # --resume: the newest whole checkpoint
    found = ckpt.newest_checkpoint(out) if cfg.resume else None
    random.seed(cfg.seed + rank)
    np.random.seed(cfg.seed + rank)
    # the same on every rank: a built model is initialised identically everywhere
    torch.manual_seed(cfg.seed)
    worlds = load_worlds(cfg)
    train_tasks, eval_tasks = task_sets(cfg, worlds)
    if not train_tasks:
        raise ConfigError(f"no training tasks in {cfg.domains}")
    held_out = eval_tasks[: cfg.eval_tasks or None]
    # Every input is checked before anything is written: the customer checks what it can now, starts
    # later
    user = (kit.customer or customer_for)(cfg, out, rank, world_size)
    user.check(train_tasks + held_out)
    # Only then is an earlier run set aside (previous-<k>/: never appended to nor overwritten)
    fresh, before = found is None, {p.name for p in out.iterdir()} if out.is_dir() else None
    out.mkdir(parents=True, exist_ok=True)
    aside = ckpt.set_aside(out) if fresh and rank == 0 else None
    if aside:
        print(f"muarl: the earlier run in {out} is kept in {aside}", flush=True)
    barrier(world_size)
    try:  # until the cold start, a failure leaves nothing behind
        run = _prepare(cfg, kit, rank, world_size, out, worlds, train_tasks, held_out, user, found, device,
                       sharded, on_gpu)
    except BaseException:
        if fresh and rank == 0:
            user.close()
            ckpt.undo_start(out, before, aside)
        raise
    return _ready(run, kit, found is None, device, engine_kind, sharded)


def _prepare(cfg, kit, rank, world_size, out, worlds, train_tasks, held_out, user, found, device, sharded,
             on_gpu) -> SimpleNamespace:
    """The log, the customer started, the policy loaded (or built), the optimizer (restored on --resume)."""
    # one global step; strict JSON; no secrets
    log = RunLog(out / "log.jsonl", rank, cfg.logger, public(cfg))
    # a served model is served now (the demo's is gated: below, exit 2)
    user.start(train_tasks + held_out, log)
    if rank == 0:
        save_config(out, cfg)  # a changed configuration keeps the previous file beside it
    for source in provenance(worlds):  # where the tau2 data came from, printed and logged
        print(f"[data] {source['domain']}: {source['path']} (sha256 {source['sha256']}; {source['revision']})")
        log({"phase": "data", **source})
    build = kit.build_model and (lambda: kit.build_model(cfg, worlds, out))
    policy, tok, model_path = build_or_load_model(cfg, device, cfg.dtype, rank, world_size, sharded, build)
    if rank == 0 and (warn := prompt_warning(tok, worlds, cfg.max_context, cfg.max_new_tokens,
                                             cfg.tools_in_prompt)):
        print(warn, flush=True)
    run = SimpleNamespace(cfg=cfg, rank=rank, world_size=world_size, out=out, log=log, worlds=worlds, user=user,
                          train_tasks=train_tasks, eval_tasks=held_out if cfg.eval else [], policy=policy, tok=tok,
                          engine=None, results={}, sampler=ckpt.TaskSampler(train_tasks, cfg.seed),
                          episodes_log=TrajectoryLog(out / f"episodes-rank{rank}.jsonl"))
    fresh = found is None
    if fresh and rank == 0 and run.eval_tasks and cfg.sft_epochs and kit.eval_untrained and not (sharded and on_gpu):
        # rank 0 (FSDP2 on a CPU: a whole copy from disk; GPUs: none)
        run_eval(run, "untrained", model=load_policy(model_path)[0] if sharded else None, trials=1)
    # (under torchrun, load_sharded sharded the policy)
    if not sharded and cfg.activation_checkpointing:
        policy.gradient_checkpointing_enable()
    # fp32 moments
    run.opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    run.start, state = ckpt.load_checkpoint(out, policy, run.opt, run.sampler, world_size, found) if found \
        else (0, {})
    run.results.update(state.get("results", {}))
    # both go on
    run.updates, log.global_step = state.get("updates", run.start), state.get("global_step", 0)
    run.model_path = model_path
    return run


def _ready(run, kit: Kit, fresh: bool, device: str, engine_kind: str, sharded: bool) -> SimpleNamespace:
    """The cold start, the frozen reference, the rollout engine, the evaluation RL starts from."""
    cfg, policy, tok, out, model_path, rank = run.cfg, run.policy, run.tok, run.out, run.model_path, run.rank
    if fresh and cfg.sft_epochs > 0:
        # the policy alone computes: no customer beside it
        torch.set_num_threads(cfg.train_threads or cfg.threads)
        cold_start(run, kit)
        torch.set_num_threads(cfg.threads)

    # The frozen reference: the policy as RL starts (after the cold start, else the model itself),
    # as in the paper, read from disk in the compute dtype (bf16 on a GPU: it never trains); under
    # FSDP2 each rank reads its shards.
    run.reference = None
    if cfg.kl_coef > 0:
        start = str(out / "cold-start" if (out / "cold-start").exists() else model_path)
        run.reference = load_sharded(start, getattr(torch, cfg.dtype), bf16=cfg.dtype == "bfloat16", frozen=True,
                                     offload=cfg.offload) if sharded \
            else load_reference(start, dtype=cfg.dtype, device=device)

    # the rollout engine: on one process "hf" shares the policy's weights; vLLM (or FSDP) keeps its
    # own copy
    run.shares_weights = engine_kind == "hf" and not sharded
    # vLLM seeds the global generators as it starts: a resumed run's are put back
    rng = ckpt.rng_state()
    if run.shares_weights:
        run.engine = make_engine("hf", model=policy, tokenizer=tok)
    elif engine_kind == "hf":
        run.engine = make_engine("hf", model=load_policy(model_path, dtype=cfg.dtype, device=device)[0],
                                 tokenizer=tok)
    else:  # on a GPU, vLLM shares the device with the trainer: it sleeps through each update
        run.engine = make_engine("vllm", model_path=model_path, tokenizer=tok, enable_sleep_mode=True,
                                 seed=cfg.seed, gpu_memory_utilization=cfg.engine_memory,
                                 max_model_len=cfg.max_context)
    ckpt.set_rng_state(rng)
    # one tensor at a time (fsdp.full_tensors), cast to the engine's dtype
    if not run.shares_weights:
        run.engine.update_weights(full_tensors(policy, dtype=getattr(torch, cfg.dtype)))
    run.agent = PolicyAgent(run.engine, tok)
    if fresh and rank == 0 and run.eval_tasks:
        run_eval(run, "cold start" if cfg.sft_epochs > 0 else "start")
        if kit.started:
            kit.started(run)
    return run


# -------------------------------------------------------------------------------------------------------------
# The loop


def train(cfg: Config, kit: Kit | None = None) -> dict:
    """The run `cfg` asks for: build_run(), then one GRPO step per iteration, then finish(). Returns the results
    table ({name: metrics} of each evaluation)."""
    run = build_run(cfg, kit or Kit())
    cfg = run.cfg  # as built: micro_batch_tokens, dtype resolved by device
    per_rank = cfg.tasks_per_step // run.world_size
    bar = tqdm(range(run.start, cfg.steps), desc="GRPO", initial=run.start, total=cfg.steps, disable=run.rank != 0)
    for step in bar:
        t0 = time.perf_counter()
        # 1. roll out: B tasks (every rank draws the same B and plays its share) x G conversations
        # each
        tasks = run.sampler.next(cfg.tasks_per_step)[run.rank * per_rank : (run.rank + 1) * per_rank]
        run.policy.eval()
        live = tqdm(desc=f"step {step} rollout", unit="episode", leave=False, mininterval=10, disable=run.rank != 0)
        # the bar: finished episodes
        episodes = rollout(tasks, cfg.group_size, run.worlds, run.agent, run.user,
                           rollout_cfg(cfg, seed=episode_seed(cfg.seed, "grpo", step, run.rank)),
                           progress=lambda done, total: live.update(done - live.n))
        live.close()
        # vLLM on a GPU frees its memory for the update; HFEngine drops its stored keys/values
        run.engine.sleep()
        # 2. score: reward 1 iff the final database is the gold one
        score(episodes, run.worlds, check_outputs=cfg.train_check_outputs)
        t1 = time.perf_counter()
        run.episodes_log.write(episodes, step=step)
        # 3. advantages, group by group (groups with an aborted episode are dropped, their tasks
        # drawn again)
        kept, adv = advantages(episodes, cfg.group_size, cfg.advantage, cfg.reward, cfg.turn_bonus,
                               cfg.drop_customer_faults)
        # one per group
        lost = [{"id": t} for t in {e.group: e.task.id for e in episodes if e.aborted}.values()]
        # every rank, in order
        run.sampler.put_back([r["id"] for r in all_gather_episodes(lost, run.world_size)])
        # 4 + 5. loss, backward, optimizer step (every rank takes the same branch: the update is
        # collective)
        run.policy.train()
        if all_sum(float(sum(sum(e.mask) for e in kept)), run.world_size) > 0:
            # (--train_threads: the customer is idle now)
            torch.set_num_threads(cfg.train_threads or cfg.threads)
            upd = update(run.policy, run.reference, kept, adv, run.opt, **update_settings(cfg),
                         world_size=run.world_size)
            torch.set_num_threads(cfg.threads)
        # a forward and backward over 0 trained tokens would cost a full update and change nothing
        else:
            upd = {"skipped": True, "reason": "no trained tokens (the prompt alone fills the context?)"
                   if all_sum(len(kept), run.world_size) else "every group had an aborted episode"}
            print(f"[step {step}] warning: update skipped: {upd['reason']}", flush=True)
        run.updates += not upd["skipped"]
        t2 = time.perf_counter()
        # 6. sync: the engine wakes first (asleep, vLLM has handed its weights' memory back); none
        # if shared
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
        # 8. evaluate and checkpoint. A customer that stays down stops the run: the checkpoint keeps
        # what this step trained; a step that trained nothing is played again on --resume.
        done = step + 1
        try:
            run.user.after(f"step {step}", {"all_aborted": st["kept_groups"] == 0 < st["aborted"], "last_error": next(
                (e.info.get("user_error", "") for e in episodes if e.aborted), "")}, run.log)
            if run.rank == 0 and cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps and run.eval_tasks:
                run_eval(run, f"GRPO step {done}", done)
        except RunStopped:
            ckpt.save_checkpoint(run.out, step + (not upd["skipped"]), run.policy, run.opt, run.sampler, state(run),
                                 run.world_size, run.rank)
            raise
        if cfg.save_every and (done % cfg.save_every == 0 or done == cfg.steps):
            ckpt.save_checkpoint(run.out, done, run.policy, run.opt, run.sampler, state(run), run.world_size,
                                 run.rank)
    return finish(run)


def state(run) -> dict:
    """What a checkpoint keeps beyond weights and sampler: the results table, updates made, the global step."""
    return {"results": run.results, "updates": run.updates, "global_step": run.log.global_step}


def finish(run) -> dict:
    """The final evaluation, checkpoint and model; the results table."""
    cfg, n = run.cfg, run.updates
    # the label says how many steps really updated the model: a run whose customer failed throughout
    # is not trained
    label = f"GRPO ({cfg.steps} steps)" if n == cfg.steps else f"GRPO ({n} of {cfg.steps} steps updated)" if n \
        else f"not trained (0 of {cfg.steps} GRPO steps updated)"
    if run.eval_tasks and cfg.steps > run.start:
        if run.rank == 0:
            run_eval(run, label, cfg.steps)
        # every rank: under FSDP, gathering the full weights for the checkpoint is a collective
        ckpt.save_checkpoint(run.out, cfg.steps, run.policy, run.opt, run.sampler, state(run), run.world_size,
                             run.rank)
    ckpt.save_pretrained(run.policy, run.tok, run.out / "final", run.world_size, run.rank)
    run.user.close()  # a served customer's server (also stopped at exit, on an error or Ctrl-C)
    if run.rank == 0:
        # runs/<name>/curves.png: the training dynamics (needs matplotlib; else one line)
        curves.draw(run.out)
        (run.out / "final" / "muarl.json").write_text(json.dumps({"model": label, "grpo_steps": cfg.steps,
                                                                  "updates": n, "data": provenance(run.worlds)}))
    if run.rank == 0 and run.results:
        table = format_table(list(run.results.items()), cfg.eval_trials)
        (run.out / "results.md").write_text(table + "\n")
        print(f"\nHeld-out success (greedy agent, customer: {run.user.label}, {cfg.eval_trials} trial(s) per task)"
              f"\n{table}")
    dist_teardown(run.world_size)
    if cfg.steps > 0 and n == 0:
        raise RunStopped(f"no GRPO step updated the model ({cfg.steps} steps, see log.jsonl): final/ holds it as "
                         "it was before RL, labelled so in results.md and final/muarl.json")
    return run.results


def main(argv: list[str] | None = None, kit: Kit | None = None) -> dict:
    """`python muarl.py ARGS` as a function: parse, check, train."""
    cfg = parse_config(argv, Config, groups=GROUPS, prog="muarl.py")
    early(cfg)
    return train(cfg, kit)


def run_cli(entry: Callable[[], object], name: str) -> None:
    """A training entry point's exits: 0 done; 2 bad input, in one line (ConfigError, PreflightError, ServeError,
    a missing file); 3 stopped on purpose (the customer is down; nothing trained), checkpoint saved."""
    try:
        entry()
        # under torchrun: leave before gloo's exit-time abort
        exit_now(int(os.environ.get("WORLD_SIZE", 1)))
    except (ImportError, OSError, ValueError) as e:
        print(f"{name}: {'config error: ' if isinstance(e, ConfigError) else ''}{e}", file=sys.stderr)
        sys.exit(2)
    except RunStopped as e:
        print(f"{name}: {e}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    run_cli(lambda: train(CLI), "muarl")

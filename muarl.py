"""MUA-RL training: a cold start on expert conversations, then GRPO on conversations with a
customer.

    python muarl.py --model Qwen/Qwen3-8B --user_model gpt-4o-2024-11-20      # the paper's recipe
    torchrun --nproc_per_node 8 muarl.py --model Qwen/Qwen3-8B --user_serve /models/Qwen3-32B
    python -m demo                                   # the CPU demo: a tiny model learns on a laptop

`train()` builds the run where you read it, as named locals in this order: the worlds and their
tasks, the customer, the policy and its tokenizer, the cold start, the frozen reference, AdamW, the
rollout engine. Then the loop (MUA-RL, Zhao et al. 2025, arXiv:2508.18669, Algorithm 1), one optimizer step
per iteration:

    1 roll out B tasks x G conversations   5 optimizer step (AdamW, grad clip; none if non-finite)
    2 score: the final database            6 sync the new weights into the rollout engine
    3 rewards -> group advantages          7 log (JSONL + progress bar)
    4 loss and backward, packed rows       8 evaluate and checkpoint, every so often

What a reader may skip (resume, checkpoints, leaving a failed start as it was found, provenance,
the run's record) is behind the calls of plumbing/startup.py. Symbols: B = tasks per step, G =
group size (rollouts per task), T = tokens, N_tok = trained tokens in a step.

Departures from the paper (see also the README):
1. One update per batch by default, as the authors ran it: old_logp = logp.detach() (ratio == 1,
   the clip acts only with --mini_batches > 1); each token weighted by min(pi / pi_sampler, C).
2. Groups with an aborted episode (the customer's endpoint failed) are dropped from the step, not
   scored 0; their tasks are drawn again. A customer down longer than --user_down_s stops the run.
"""

from __future__ import annotations

import sys

from config import GROUPS, Config, validate
from plumbing.flags import ConfigError, parse_config, run_cli
from plumbing.validate import early

# The command line is read first, so --help and a bad flag answer before torch loads.
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
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import chat
import sft
from domains import load_worlds, task_sets
from domains.tau2_data import provenance
from engine import check_vllm_model, make_engine, rollout_engine
from eval import HeldOut, format_table
from grpo import (ADVANTAGES, REWARDS, grpo_loss, pack_sequences, tis_weights, token_advantages,
                  token_logprobs)
from plumbing import startup
from plumbing.flags import public
from plumbing.fsdp import (all_gather_episodes, all_sum, bf16_compute, compute_device, dist_setup,
                           dist_teardown, even_rows, full_tensors, is_sharded, place, reduce_stats, reshard,
                           sharded_call)
from plumbing.models import build_or_load_model, load_policy, reference_for
from plumbing.preflight import RunStopped
from plumbing.runlog import RunLog, page_groups, record_tokens, step_stats, write_sample
from plumbing.sampling import episode_seed
from plumbing.serve import customer_for
from plumbing.checkpoint import rng_state, set_rng_state
from plumbing.validate import row_note
from rollout import PolicyAgent, RolloutConfig, TrajectoryLog, rollout, score
from user_sim import make_user


# --------------------------------------------------------------------------------------------------
# 1. The task order: epochs of seeded shuffles, resumable (plumbing/checkpoint.py saves its place)


class TaskSampler:
    """Tasks in epochs, each a shuffle seeded by (seed, epoch), so (epoch, pos) alone is where a run
    is in them; plus `again`, the ids of tasks handed back (their group aborted: not consumed),
    drawn first."""

    def __init__(self, tasks: list, seed: int):
        self.tasks, self.seed, self.epoch, self.pos, self.again = tasks, seed, 0, 0, []
        self.by_id = {getattr(t, "id", t): t for t in tasks}

    def put_back(self, ids: list) -> None:
        self.again += ids

    def next(self, n: int) -> list:
        out = [self.by_id[i] for i in self.again[:n]]
        self.again = self.again[n:]
        while len(out) < n:  # a draw that runs past the end of an epoch goes on into the next one
            order = list(range(len(self.tasks)))
            random.Random(self.seed * 100003 + self.epoch).shuffle(order)  # its own generator: global ones untouched
            take = order[self.pos : self.pos + n - len(out)]
            out += [self.tasks[i] for i in take]
            self.pos += len(take)
            if self.pos >= len(order):
                self.epoch, self.pos = self.epoch + 1, 0
        return out


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


def update(policy, reference, episodes, advantages, opt, cfg: Config, world_size: int = 1, keep=()) -> dict:
    """GRPO on this rank's episodes: pack, log-probs, loss, backward, step; --mini_batches optimizer
    steps (1: the paper's one update per batch). From `cfg` it reads the numbers below.

    An optimizer step's loss is the token mean over every trained token of its rows on every rank;
    each packed row (of at most `row_tokens`; a longer episode gets a row of its own, counted as
    `long_rows`) adds its share (masked sum / N_tok) to the gradient, so splitting into rows changes
    nothing. With `bf16` the forward computes in bf16 while AdamW updates fp32 weights. `sampler`:
    the engine's (temperature, top-p), so the trainer's log-probs are compared like for like with
    the engine's (`logp_gap`) and weigh each token by min(pi_trainer / pi_engine, tis_cap)
    (grpo.tis_weights; 0: off). `keep`: episodes whose trainer log-probs come back under "seen"
    (the run's page, plumbing/view.py)."""
    row_tokens, chunk, kl_coef, tis_cap = cfg.micro_batch_tokens, cfg.logprob_chunk, cfg.kl_coef, cfg.tis_cap
    bf16, mini_batches = cfg.dtype == "bfloat16", cfg.mini_batches
    clip, sampler = (cfg.clip_low, cfg.clip_high), (cfg.temperature, cfg.top_p)
    rows = pack_sequences([e.ids for e in episodes], [e.mask for e in episodes], row_tokens,
                          adv=advantages, sample_logp=[e.logprobs for e in episodes])
    # Under FSDP every rank runs as many rows (empty ones, mask 0, where it has fewer), and the forward
    # runs as a registered method of the sharded model, so that its root gathers.
    empty = pack_sequences([[0, 0]], [[0, 0]], 2, adv=[0.0], sample_logp=[[0.0, 0.0]])[0]
    rows = even_rows(rows, world_size, empty)
    logprobs = sharded_call(token_logprobs) if is_sharded(policy) else token_logprobs
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
        norms.append(float(torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)))
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


# --------------------------------------------------------------------------------------------------
# The run: built in view, then the loop


def train(cfg: Config) -> dict:
    """The run `cfg` asks for: its parts built in order, then one GRPO step an iteration; returns
    the results table."""
    rank, world_size = dist_setup(cfg.offload)
    validate(cfg, world_size)
    # The dtype and the devices are settled here (--plan N prints the memory plan and stops).
    cfg, device, engine_kind, on_gpu, sharded = place(cfg, rank, world_size)
    if rank == 0 and (note := row_note(cfg)):  # (rows shorter than a conversation are said once)
        print(note, flush=True)
    if engine_kind == "vllm":  # a model vLLM cannot run is refused now, not after the cold start
        check_vllm_model(cfg.model, on_cpu=not on_gpu)
    out = Path(cfg.out_dir)
    found = startup.resume_point(cfg.resume, out, rank, world_size)  # None: a fresh run
    random.seed(cfg.seed + rank)
    np.random.seed(cfg.seed + rank)
    torch.manual_seed(cfg.seed)  # the same on every rank, so every rank initialises alike

    # The worlds and their tasks: the training tasks, and the held-out ones evaluations play.
    worlds = load_worlds(cfg)
    train_tasks, eval_tasks = task_sets(cfg, worlds)
    if not train_tasks:
        raise ConfigError(f"no training tasks in {cfg.domains}")
    held_out = eval_tasks[: cfg.eval_tasks or None]
    # The customer checks what it can before anything is written (an endpoint, a model folder).
    user = customer_for(cfg, make_user, out, rank, world_size)
    user.check(train_tasks + held_out, worlds)

    with startup.kept_as_found(out, found is None, rank, world_size, on_failure=user.close):
        log = RunLog(out / "log.jsonl", rank, cfg.logger, public(cfg))  # (no secret is logged)
        user.start(train_tasks + held_out, log)  # a served customer model is served now
        startup.record_start(out, cfg, provenance(worlds), log, rank)
        # The policy and its tokenizer: fp32 weights (AdamW's masters); under torchrun, this rank's
        # shards of them.
        policy, tok, model_path = build_or_load_model(cfg, device, cfg.dtype, rank, world_size,
                                                      sharded)
        if rank == 0 and (warn := chat.prompt_warning(tok, worlds, cfg.max_context, cfg.max_new_tokens,
                                                      cfg.tools_in_prompt)):
            print(warn, flush=True)
        if not sharded and cfg.activation_checkpointing:  # (load_sharded set it under torchrun)
            policy.gradient_checkpointing_enable()
        # The evaluations share the held-out tasks, a greedy agent, one seed and the run's log.
        episodes_log = TrajectoryLog(out / f"episodes-rank{rank}.jsonl")
        evals = HeldOut(held_out if cfg.eval else [], worlds, user,
                        RolloutConfig.of(cfg, greedy=True, seed=cfg.seed), cfg.eval_trials, out,
                        episodes_log, log, cfg.user_gate)
        # The model as it comes, before the cold start changes it (FSDP2 on GPUs keeps no whole copy to
        # play it with; on a CPU a whole copy is read from disk).
        if found is None and rank == 0 and evals.tasks and cfg.sft_epochs \
                and not (sharded and on_gpu):
            untrained = load_policy(model_path)[0] if sharded else policy
            untrained_agent = PolicyAgent(make_engine("hf", model=untrained, tokenizer=tok), tok)
            evals.run("untrained", untrained_agent, trials=1)

    # The cold start: SFT on expert conversations, on exactly the tokens RL trains (sft.py). The policy
    # alone computes now, so it may take the customer's threads.
    if found is None and cfg.sft_epochs > 0:
        torch.set_num_threads(cfg.train_threads or cfg.threads)
        convs = sft.conversations(cfg.sft_data, train_tasks, seed=cfg.seed,
                                  tools=cfg.tools_in_prompt)
        examples = sft.render_examples(tok, convs, worlds)
        sft.cold_start(policy, tok, examples, out / "cold-start", log=log, epochs=cfg.sft_epochs,
                       batch_size=cfg.sft_batch, lr=cfg.sft_lr, seed=cfg.seed,
                       micro_batch_tokens=cfg.micro_batch_tokens, chunk_size=cfg.logprob_chunk,
                       bf16=cfg.dtype == "bfloat16", world_size=world_size, rank=rank)
        torch.set_num_threads(cfg.threads)
    # The frozen reference: the policy as RL starts, read from disk (None when --kl_coef is 0).
    reference = reference_for(cfg, out, model_path, device, sharded)
    # AdamW keeps fp32 moments. On --resume the weights, the moments, the task order, the random
    # generators and the results come back from the checkpoint.
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sampler = TaskSampler(train_tasks, cfg.seed)
    start, restored, updates = startup.restore(found, out, policy, opt, sampler, world_size, log)
    evals.results.update(restored)

    def save(step: int) -> None:  # a checkpoint of the run as it stands (a collective under FSDP)
        startup.save(out, step, policy, opt, sampler, evals.results, updates, log, world_size, rank)

    if found is None and cfg.sft_epochs > 0:
        save(0)  # before vLLM starts: a --resume after it refused starts after the cold start
    # The rollout engine: the policy itself (transformers, one process), or vLLM synced after each
    # update. vLLM seeds the global generators as it starts, so they are put back.
    rng = rng_state()
    engine, shares_weights = rollout_engine(engine_kind, policy, tok, model_path, cfg, device,
                                            sharded)
    set_rng_state(rng)
    if not shares_weights:  # the first push, as step 6 does it (the KV cache asleep meanwhile)
        engine.sleep()
        engine.wake_up()
        engine.update_weights(full_tensors(policy, dtype=getattr(torch, cfg.dtype)))
    agent = PolicyAgent(engine, tok)
    start_name = cfg.start_name or ("cold start" if cfg.sft_epochs > 0 else "start")
    if start == 0 and rank == 0 and evals.tasks and start_name not in evals.results:
        evals.run(start_name, agent, first=True)  # (a run resumed at step 0 evaluates its start then)

    per_rank, quiet = cfg.tasks_per_step // world_size, rank != 0  # (one progress bar, rank 0's)
    bar = tqdm(range(start, cfg.steps), desc="GRPO", initial=start, total=cfg.steps, disable=quiet)
    for step in bar:
        t0 = time.perf_counter()
        # 1. Roll out B tasks x G conversations: every rank draws the same B and plays its share.
        tasks = sampler.next(cfg.tasks_per_step)[rank * per_rank : (rank + 1) * per_rank]
        policy.eval()
        live = tqdm(desc=f"step {step} rollout", unit="episode", leave=False, mininterval=10,
                    disable=quiet)
        episodes = rollout(tasks, cfg.group_size, worlds, agent, user,
                           RolloutConfig.of(cfg, seed=episode_seed(cfg.seed, "grpo", step, rank)),
                           progress=lambda done, total: live.update(done - live.n))
        live.close()
        # vLLM on a GPU frees its memory for the update; the transformers engine drops its cache.
        engine.sleep()
        # 2. Score: the reward is 1 if and only if the final database is the gold one.
        score(episodes, worlds, check_outputs=cfg.train_check_outputs)
        t1 = time.perf_counter()
        episodes_log.write(episodes, step=step)
        # 3. Advantages, group by group. A group with an aborted episode is dropped, and its task is
        # drawn again once: every rank puts back the same tasks, in the same order.
        kept, adv = advantages(episodes, cfg.group_size, cfg.advantage, cfg.reward, cfg.turn_bonus,
                               cfg.drop_customer_faults)
        lost = [{"id": t} for t in {e.group: e.task.id for e in episodes if e.aborted}.values()]
        sampler.put_back([r["id"] for r in all_gather_episodes(lost, world_size)])
        # 4 + 5. Loss, backward and the optimizer step. Every rank takes the same branch, because the
        # update is collective.
        policy.train()
        keep = page_groups(kept, adv, cfg.group_size) if rank == 0 else []  # the groups the run's page shows
        if all_sum(float(sum(sum(e.mask) for e in kept)), world_size) > 0:
            torch.set_num_threads(cfg.train_threads or cfg.threads)  # (the customer is idle now)
            upd = update(policy, reference, kept, adv, opt, cfg, world_size=world_size, keep=keep)
            torch.set_num_threads(cfg.threads)
        else:  # a forward and backward over no trained token would cost a full update and change nothing
            upd = {"skipped": True, "reason": "no trained tokens (the prompt alone fills the context?)"
                   if all_sum(len(kept), world_size) else "every group had an aborted episode"}
            print(f"[step {step}] warning: update skipped: {upd['reason']}", flush=True)
        updates += not upd["skipped"]
        t2 = time.perf_counter()
        # 6. Sync the new weights into the engine, woken first (asleep, vLLM gave its weights back).
        engine.wake_up()
        if not shares_weights:
            engine.update_weights(full_tensors(policy, dtype=getattr(torch, cfg.dtype)))
        t3 = time.perf_counter()
        # 7. Log the step's numbers; every 10 steps one whole episode with its mask, and at every step
        # one or two groups token by token, as the loss saw them (view.html).
        if rank == 0:
            record_tokens(out, step, kept, adv, keep, upd.pop("seen", {}), tok, cfg.group_size, cfg.tis_cap)
        st = step_stats(episodes, len(kept) // cfg.group_size, cfg.group_size, world_size)
        log({"phase": "grpo", "step": step, **st, **upd, "rollout_s": t1 - t0, "update_s": t2 - t1,
             "sync_s": t3 - t2, "tokens_per_s": st["tokens"] / max(1e-9, t3 - t0),
             "user": user.take_stats()})  # the customer endpoint's health (rank 0's)
        if rank == 0 and step % 10 == 0 and episodes:
            write_sample(out, step, episodes[0], chat.show_mask(tok, episodes[0].ids, episodes[0].mask))
        bar.set_postfix(reward=f"{st['reward']:.3f}", kl=f"{upd.get('kl', 0):.4f}", turns=f"{st['turns']:.1f}")
        # 8. Evaluate and checkpoint. A customer that stays down stops the run: the checkpoint keeps
        # what this step trained, and a step that trained nothing is played again on --resume.
        done = step + 1
        try:
            why = next((e.info.get("user_error", "") for e in episodes if e.aborted), "")
            user.after(f"step {step}", {"all_aborted": st["kept_groups"] == 0 < st["aborted"], "last_error": why},
                       log)
            if rank == 0 and evals.tasks and cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
                evals.run(f"GRPO step {done}", agent, done)
        except RunStopped:
            save(step + (not upd["skipped"]))
            raise
        if cfg.save_every and (done % cfg.save_every == 0 or done == cfg.steps):
            save(done)

    # The end: the final evaluation (its label says how many steps updated the model), the final
    # checkpoint and model, the run's record.
    label = f"GRPO ({cfg.steps} steps)" if updates == cfg.steps else f"GRPO ({updates} of {cfg.steps} steps " \
        "updated)" if updates else f"not trained (0 of {cfg.steps} GRPO steps updated)"
    if evals.tasks and cfg.steps > start:
        if rank == 0:
            evals.run(label, agent, cfg.steps)
        save(cfg.steps)  # every rank: under FSDP, gathering the full weights is a collective
    table = format_table(list(evals.results.items()), cfg.eval_trials) if evals.results else ""
    startup.finish(out, label, cfg.steps, updates, policy, tok, provenance(worlds), table, cfg.eval_trials,
                   user.label, world_size, rank)
    user.close()  # a served customer's server (also stopped at exit, on an error or Ctrl-C)
    dist_teardown(world_size, engine)  # the engine first: vLLM leaves no traceback at exit
    if cfg.steps > 0 and updates == 0:
        raise RunStopped(f"no GRPO step updated the model ({cfg.steps} steps, see log.jsonl): final/ "
                         "holds it as it was before RL, labelled so in results.md and final/muarl.json")
    return evals.results


def main(argv: list[str] | None = None) -> dict:
    """`python muarl.py ARGS` as a function: parse, check, train."""
    cfg = parse_config(argv, Config, groups=GROUPS, prog="muarl.py")
    early(cfg)
    return train(cfg)


if __name__ == "__main__":
    run_cli(lambda: train(CLI), "muarl")

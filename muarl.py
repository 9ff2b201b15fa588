"""MUA-RL training: cold-start SFT, then GRPO on live multi-turn conversations with a simulated user.

    python muarl.py --model tiny                                   # CPU demo: builds a tiny model, SFT, GRPO, table
    python muarl.py --model Qwen/Qwen3-8B --domains retail,airline --user llm --user_model gpt-4.1 ...
    torchrun --nproc_per_node 8 muarl.py --model Qwen/Qwen3-32B ...  # FSDP2, one rollout engine per rank

The loop (paper, Algorithm 1), one optimizer step per iteration:

    1 sample B tasks                     5 optimizer step (AdamW, grad clip; skipped if not finite)
    2 roll out B x G conversations       6 sync the new weights into the rollout engine
    3 rewards -> group advantages        7 log (JSONL + progress bar)
    4 loss and backward, micro-batched   8 evaluate and checkpoint, every so often

Symbols: B = tasks per step, G = group size (rollouts per task), T = tokens, N_tok = trained tokens in a step.

Departures from the paper (see also the README):
1. One update per batch, as the authors ran it: the policy that sampled is the policy we update, so
   old_logp = logp.detach() (ratio == 1, the clip never fires) instead of a second forward pass. The engine's
   sampling log-probs are compared with the trainer's as a diagnostic (`logp_gap`).
2. `--model tiny` switches to a CPU preset (config.TINY): the shop world (domains/shop.py), a model built from
   scratch that first gets copy drills (a stand-in for pre-training), short turns, a larger learning rate,
   top-p 0.9 in training, the tool schemas learned from SFT data instead of read from the prompt.
3. Groups with an aborted episode (the user simulator failed) are dropped from the step, not scored 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

from checkpoint import TaskSampler, load_checkpoint, save_checkpoint, save_pretrained
from config import TINY, Config, ConfigError, parse_config, validate  # noqa: F401  (muarl.Config etc. stay)
from fsdp import (all_reduce, all_sum, barrier, dist_setup, dist_teardown, even_rows, exit_now,
                  full_state_dict, logprobs_fn, shard)


# ---------------------------------------------------------------------------------------------------------------
# 3 + 4. Advantages and the update


def episode_advantages(episodes, group_size: int, scale_by_std: bool):
    """Rewards -> advantages, group by group. Groups holding an aborted episode are dropped (returned as None)."""
    from grpo import group_advantages

    keep, adv = [], []
    for g in range(0, len(episodes), group_size):
        group = episodes[g : g + group_size]
        if any(e.aborted for e in group):
            continue
        rewards = torch.tensor([e.reward for e in group])  # (G,)
        adv += group_advantages(rewards, group_size, scale_by_std=scale_by_std).tolist()
        keep += group
    return keep, adv


def update(policy, reference, episodes, advantages, opt, cfg: Config, world_size: int = 1) -> dict:
    """One optimizer step of GRPO on this rank's episodes. Returns stats (plain floats).

    The step's loss is the token mean over every trained token of every rank's episodes; each packed row adds
    its share (masked sum / N_tok) to the gradient, so splitting into micro-batches changes nothing.
    """
    from grpo import grpo_loss, pack_sequences

    seqs, masks = [e.ids for e in episodes], [e.mask for e in episodes]
    rows = pack_sequences(seqs, masks, cfg.micro_batch_tokens, adv=advantages, sample_logp=[e.logprobs for e in episodes])
    # FSDP: every rank runs as many rows (a rank whose groups all aborted runs only empty ones)
    empty = pack_sequences([[0, 0]], [[0, 0]], 2, adv=[0.0], sample_logp=[[0.0, 0.0]])[0]
    rows = even_rows(rows, world_size, empty)
    n_tok = all_sum(float(sum(sum(m) for m in masks)), world_size)  # N_tok of the whole step
    opt.zero_grad(set_to_none=True)
    totals = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "entropy": 0.0, "logp_gap": 0.0, "tokens": 0.0}
    rmin, rmax = float("inf"), float("-inf")
    for row in rows:
        ids, pos, mask = row["input_ids"], row["position_ids"], row["mask"]  # (1, L) each
        ref_logp = None
        if cfg.kl_coef > 0 and reference is not None:
            with torch.no_grad():
                ref_logp = logprobs_fn(reference)(ids, position_ids=pos, chunk_size=cfg.logprob_chunk)  # (1, L)
        logp, ent = logprobs_fn(policy)(ids, position_ids=pos, chunk_size=cfg.logprob_chunk, return_entropy=True)
        old_logp = logp.detach()  # one update per batch: the sampling policy is this policy (departure 1)
        loss, st = grpo_loss(logp, old_logp, ref_logp, row["adv"], mask, cfg.clip_low, cfg.clip_high,
                             cfg.kl_coef, num_tokens=max(n_tok, 1.0), entropy=ent)
        loss.backward()
        w = st["tokens"]
        totals["loss"] += loss.item()
        for k in ("clip_frac", "kl", "entropy"):
            totals[k] += st.get(k, 0.0) * w
        gap = ((row["sample_logp"] - logp.detach()).abs() * mask).sum().item()  # engine vs trainer log-probs
        totals["logp_gap"] += gap
        totals["tokens"] += w
        if w > 0:
            rmin, rmax = min(rmin, st["ratio_min"]), max(rmax, st["ratio_max"])
    gnorm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
    # the step's loss and logged statistics are the whole step's: sums (token-weighted) added over the ranks
    totals = dict(zip(totals, all_reduce(list(totals.values()), world_size)))
    loss_all = totals["loss"]
    rmin, rmax = all_reduce([rmin], world_size, "min")[0], all_reduce([rmax], world_size, "max")[0]
    finite = math.isfinite(loss_all) and bool(torch.isfinite(torch.as_tensor(gnorm)))
    if finite:
        opt.step()
    opt.zero_grad(set_to_none=True)
    tok = max(totals["tokens"], 1.0)
    return {
        "loss": loss_all, "grad_norm": float(gnorm), "skipped": not finite, "ratio_min": rmin, "ratio_max": rmax,
        **{k: totals[k] / tok for k in ("clip_frac", "kl", "entropy", "logp_gap")}, "trained_tokens": n_tok,
    }


# ---------------------------------------------------------------------------------------------------------------
# Setup helpers


def task_sets(cfg: Config, worlds: dict) -> tuple[list, list]:
    """(training tasks, held-out tasks). With --tasks synthetic, the retail world gets generated tasks: the
    held-out ones involve only a reserved set of users, the training ones only the others, and neither touches a
    user of tau2's test split (the generator's default), so no task the agent trains on leaks into evaluation."""
    train, held_out = [], []
    for name, w in worlds.items():
        if cfg.tasks == "synthetic" and name != "synthetic":
            from domains import synthetic

            users = [u for u, _ in w.new_env().db.scan("users")]
            random.Random(cfg.synthetic_seed).shuffle(users)
            k = max(1, len(users) // 5)  # a fifth of the users are held out
            held_out += synthetic.generate_tasks(w, cfg.synthetic_test, seed=2 * cfg.synthetic_seed + 1,
                                                 users=users[:k], prefix=f"synth-{name}/test")
            train += synthetic.generate_tasks(w, cfg.synthetic_train, seed=2 * cfg.synthetic_seed, users=users[k:],
                                              avoid=w.tasks("test") + held_out, prefix=f"synth-{name}/train")
        else:
            train += w.tasks("train")
            held_out += w.tasks("test")
    return train, held_out


def load_worlds(cfg: Config) -> dict:
    from domains import load_world

    worlds = {}
    for d in cfg.domains.split(","):
        if d == "synthetic":
            worlds[d] = load_world(d, seed=cfg.synthetic_seed, n_train=cfg.synthetic_train, n_test=cfg.synthetic_test,
                                   n_users=cfg.synthetic_users, n_test_users=cfg.synthetic_test_users)
        elif d == "shop":  # one held-out order per test task, 400 more orders for the training tasks
            n_test_orders = max(200, cfg.synthetic_test)
            worlds[d] = load_world(d, seed=cfg.synthetic_seed, n_train=cfg.synthetic_train, n_test=cfg.synthetic_test,
                                   n_orders=n_test_orders + 400, n_test_orders=n_test_orders, lazy_rate=cfg.lazy_rate)
        else:
            worlds[d] = load_world(d, data_dir=cfg.data_dir or None)
    return worlds


def make_user_from(cfg: Config):
    from user_sim import make_user

    return make_user(cfg.user, model=cfg.user_model or None, base_url=cfg.user_base_url or None,
                     api_key=cfg.user_api_key or None, temperature=cfg.user_temperature, seed=cfg.seed)


def build_or_load_model(cfg: Config, worlds: dict, out: Path, device: str, dtype: str, rank: int = 0,
                        world_size: int = 1):
    """(policy, tokenizer, model_path). `tiny` builds a model and tokenizer from the training tasks' text (rank 0
    builds and saves it; under torchrun the other ranks wait, then load the same files)."""
    from models import build_tiny, load_policy

    if cfg.model != "tiny":
        model, tok = load_policy(cfg.model, dtype=dtype, device=device)
        return model, tok, cfg.model
    path = out / "tiny-init"
    if not (path / "config.json").exists() and rank == 0:
        texts = []
        for w in worlds.values():
            texts.append(w.policy)
            texts += [json.dumps(t.expert) for t in w.tasks("train")[:400] if t.expert]
        build_tiny(path, seed=cfg.seed, texts=texts, hidden=cfg.tiny_hidden, layers=cfg.tiny_layers,
                   split_digits=cfg.tiny_split_digits, vocab_size=cfg.tiny_vocab, intermediate=cfg.tiny_intermediate)
    barrier(world_size)
    model, tok = load_policy(str(path), dtype="float32", device=device)
    return model, tok, str(path)


def rollout_cfg(cfg: Config, greedy: bool = False, seed: int | None = None):
    from rollout import RolloutConfig

    return RolloutConfig(max_turns=cfg.max_turns, max_context=cfg.max_context, max_new_tokens=cfg.max_new_tokens,
                         temperature=0.0 if greedy else cfg.temperature, top_p=cfg.top_p, tools_in_prompt=cfg.tools_in_prompt,
                         check_outputs=greedy or cfg.train_check_outputs, malformed=cfg.malformed, seed=seed)


class Logger:
    """JSONL log of every step (append-only) + the console."""

    def __init__(self, path: Path, rank: int):
        self.path, self.rank = path, rank

    def __call__(self, record: dict) -> None:
        if self.rank == 0:
            with open(self.path, "a") as f:
                f.write(json.dumps({"time": time.time(), **record}) + "\n")


def step_stats(episodes, kept_groups: int, group_size: int, world_size: int = 1) -> dict:
    """What a step's episodes did, over every rank's episodes (under FSDP each rank plays its share of the tasks;
    the summaries are gathered, so every rank logs the whole step)."""
    from collections import Counter

    eps = [{"reward": e.reward, "turns": e.turns, "agent_tokens": sum(e.mask), "tokens": len(e.ids),
            "tool_calls": list(e.tool_calls), "stop_reason": e.stop_reason} for e in episodes]
    if world_size > 1:
        import torch.distributed as dist

        parts = [None] * world_size
        dist.all_gather_object(parts, eps)  # rank r's groups stay whole and in order
        eps = [e for part in parts for e in part]
        kept_groups = int(all_sum(kept_groups, world_size))
    n = max(1, len(eps))
    calls = Counter(c for e in eps for c in e["tool_calls"])
    groups = [eps[i : i + group_size] for i in range(0, len(eps), group_size)]
    return {
        "reward": sum(e["reward"] for e in eps) / n,
        "all_correct_groups": sum(all(e["reward"] == 1 for e in g) for g in groups) / max(1, len(groups)),
        "all_wrong_groups": sum(all(e["reward"] == 0 for e in g) for g in groups) / max(1, len(groups)),
        "kept_groups": kept_groups,
        "episodes": len(eps),
        "tokens": sum(e["tokens"] for e in eps),
        "turns": sum(e["turns"] for e in eps) / n,
        "agent_tokens": sum(e["agent_tokens"] for e in eps) / n,
        "tool_mix": dict(calls),
        "think_rate": calls["think"] / max(1, sum(calls.values())),
        "calculate_rate": calls["calculate"] / max(1, sum(calls.values())),
        "transfer_rate": calls["transfer_to_human_agents"] / max(1, sum(calls.values())),
        "stop_reasons": dict(Counter(e["stop_reason"] for e in eps)),
    }


# ---------------------------------------------------------------------------------------------------------------
# The run


def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(argv)
    rank, world_size = dist_setup()
    validate(cfg, world_size)
    from engine import make_engine
    from eval import evaluate, format_table
    from models import load_reference
    from rollout import TrajectoryLog, rollout
    import sft

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    on_gpu = torch.cuda.is_available()
    device = f"cuda:{torch.cuda.current_device()}" if on_gpu else "cpu"
    dtype = ("bfloat16" if on_gpu else "float32") if cfg.dtype == "auto" else cfg.dtype
    engine_kind = ("vllm" if on_gpu else "hf") if cfg.engine == "auto" else cfg.engine
    if engine_kind == "vllm" and cfg.model != "tiny":  # a model vLLM cannot run: say so now, not after SFT
        from engine import check_vllm_model

        check_vllm_model(cfg.model, on_cpu=not on_gpu)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(cfg.seed + rank)
    np.random.seed(cfg.seed + rank)
    torch.manual_seed(cfg.seed)
    log = Logger(out / "log.jsonl", rank)
    episodes_log = TrajectoryLog(out / f"episodes-rank{rank}.jsonl")
    if rank == 0:
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))

    # worlds, tasks, user: everything that can fail on bad input fails here, before any model is loaded
    worlds = load_worlds(cfg)
    train_tasks, eval_tasks = task_sets(cfg, worlds)
    eval_tasks = eval_tasks[: cfg.eval_tasks] if cfg.eval_tasks else eval_tasks
    if not train_tasks:
        raise ConfigError(f"no training tasks in {cfg.domains}")
    user = make_user_from(cfg)

    policy, tok, model_path = build_or_load_model(cfg, worlds, out, device, dtype, rank, world_size)
    sampler = TaskSampler(train_tasks, cfg.seed)
    fresh = not (cfg.resume and (out / "latest.json").exists())
    engine = None  # the rollout engine, built after the cold start; evaluations before it use the policy itself
    results = {}

    def run_eval(name: str):
        eng = engine if engine is not None else make_engine("hf", model=policy, tokenizer=tok)
        m, _ = evaluate(eval_tasks, worlds, eng, tok, user, rollout_cfg(cfg, greedy=True), log=episodes_log)
        results[name] = m
        log({"phase": "eval", "name": name, **m})
        print(f"[eval] {name}: pass^1 {100 * m['pass^1']:.1f}% over {len(eval_tasks)} held-out tasks", flush=True)

    if fresh and rank == 0 and eval_tasks and cfg.sft_epochs > 0:
        run_eval("untrained")  # rank 0 alone, on the whole model: before it is sharded
    # Under torchrun the policy is sharded now, so the cold start and RL both train it with FSDP2
    if world_size > 1:
        policy = shard(policy, cfg.activation_checkpointing, bf16=dtype == "bfloat16")
    elif cfg.activation_checkpointing:
        policy.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start, state = (load_checkpoint(out, policy, opt, sampler, world_size) if cfg.resume else (0, {}))
    results.update(state.get("results", {}))

    # 0. cold start (SFT), unless resuming past it
    cold_start = start == 0 and not state
    if cold_start and cfg.sft_epochs > 0:
        convs = sft.load_jsonl(cfg.sft_data) if cfg.sft_data else sft.expert_conversations(train_tasks)
        if not convs:
            raise ConfigError("cold start needs conversations: synthetic tasks or --sft_data")
        ranks = {"world_size": world_size, "rank": rank}
        if cfg.model == "tiny" and cfg.copy_warmup > 0:  # a random model cannot copy yet: drills first
            words = sorted({w for t in train_tasks[:400] for msg in t.expert or []
                            for w in re.findall(r"[a-z]+", msg.get("content") or "")})
            drills = sft.copy_examples(tok, 16 * cfg.copy_warmup, seed=cfg.seed, words=words)
            sft.train(policy, drills, epochs=1, batch_size=16, lr=cfg.copy_lr, warmup=20, seed=cfg.seed,
                      micro_batch_tokens=cfg.micro_batch_tokens, chunk_size=cfg.logprob_chunk,
                      log=lambda r: log({**r, "phase": "copy_warmup"}), desc="copy drills", **ranks)
        tools = None if cfg.tools_in_prompt else []
        examples = sft.render_examples(tok, [dict(c, tools=tools) if tools == [] else c for c in convs], worlds)
        sft.train(policy, examples, epochs=cfg.sft_epochs, batch_size=cfg.sft_batch, lr=cfg.sft_lr,
                  micro_batch_tokens=cfg.micro_batch_tokens, chunk_size=cfg.logprob_chunk, seed=cfg.seed, log=log,
                  **ranks)
        opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        save_pretrained(policy, tok, out / "cold-start", world_size, rank)  # every rank: a collective

    # the frozen reference: the policy as RL starts (after the cold start), as in the paper
    reference = None
    if cfg.kl_coef > 0:
        if (out / "cold-start").exists():  # loaded on the CPU, in the policy's dtype
            reference = load_reference(str(out / "cold-start"), dtype=policy.dtype)
        elif state or world_size > 1:  # the starting weights are on disk (the policy moved on, or is sharded)
            reference = load_reference(model_path, dtype=policy.dtype)
        else:
            reference = load_reference(model=policy)
        if world_size > 1:  # fully_shard moves each rank's shard to its device: the whole never lands on a GPU
            reference = shard(reference, False, bf16=dtype == "bfloat16")
        else:
            reference.to(device)

    # the rollout engine: on CPU it shares the policy's weights; vLLM (or FSDP) keeps its own copy, synced below
    if engine_kind == "hf" and world_size == 1:
        engine = make_engine("hf", model=policy, tokenizer=tok)
    elif engine_kind == "hf":
        from models import load_policy

        engine = make_engine("hf", model=load_policy(model_path, dtype=dtype, device=device)[0], tokenizer=tok)
        engine.update_weights(full_state_dict(policy, world_size).items())
    else:
        # on a GPU, vLLM shares the device with the trainer: it sleeps through each update (below)
        engine = make_engine("vllm", model_path=model_path, tokenizer=tok, enable_sleep_mode=True, seed=cfg.seed)
        engine.update_weights(full_state_dict(policy, world_size).items())
    if cold_start and rank == 0 and eval_tasks:
        run_eval("cold start" if cfg.sft_epochs > 0 else "start")

    from tqdm import tqdm

    per_rank = cfg.tasks_per_step // world_size
    bar = tqdm(range(start, cfg.steps), desc="GRPO", initial=start, total=cfg.steps, disable=rank != 0)
    for step in bar:
        t = {"start": time.perf_counter()}
        # 1. sample tasks (every rank draws the same B, then takes its share), 2. roll out B x G episodes
        tasks = sampler.next(cfg.tasks_per_step)[rank * per_rank : (rank + 1) * per_rank]
        policy.eval()
        # episode k samples with seed + k (rollout.turn_seed): steps and ranks get seeds 2^16 apart
        episodes = rollout(tasks, cfg.group_size, worlds, engine, tok, user,
                           rollout_cfg(cfg, seed=((cfg.seed * 1_000_003 + step) * 4096 + rank) * 2**16))
        engine.sleep()  # vLLM on a GPU frees its memory for the update; HFEngine drops its stored keys/values
        t["rollout"] = time.perf_counter()
        episodes_log.write(episodes, step=step)
        # 3. advantages, group by group (aborted groups dropped)
        kept, adv = episode_advantages(episodes, cfg.group_size, cfg.scale_by_std)
        # 4 + 5. loss, backward, optimizer step
        policy.train()
        if all_sum(len(kept), world_size) > 0:  # every rank takes the same branch: the update is collective
            upd = update(policy, reference, kept, adv, opt, cfg, world_size)
        else:
            upd = {"skipped": True, "reason": "every group had an aborted episode"}
        t["update"] = time.perf_counter()
        # 6. sync the new weights into the rollout engine (a no-op when it shares the policy's weights). It wakes
        # first: a sleeping vLLM engine has handed its weights' memory back, so they cannot be written
        engine.wake_up()
        if not (engine_kind == "hf" and world_size == 1):
            engine.update_weights(full_state_dict(policy, world_size).items())
        t["sync"] = time.perf_counter()
        # 7. log
        st = step_stats(episodes, len(kept) // cfg.group_size, cfg.group_size, world_size)  # all ranks' episodes
        rec = {"phase": "grpo", "step": step, **st, **upd,
               "rollout_s": t["rollout"] - t["start"], "update_s": t["update"] - t["rollout"], "sync_s": t["sync"] - t["update"],
               "tokens_per_s": st["tokens"] / max(1e-9, t["sync"] - t["start"])}
        if upd.get("skipped"):
            print(f"[step {step}] update skipped: {upd.get('reason', 'non-finite loss or gradient')}", flush=True)
        log(rec)
        if rank == 0 and step % 10 == 0 and episodes:  # every so often, one whole episode with its mask
            import chat

            with open(out / "samples.txt", "a") as f:
                e = episodes[0]
                f.write(f"=== step {step}  task {e.task.id}  reward {e.reward}  stop {e.stop_reason}  "
                        f"(trained tokens in [[...]])\n{chat.show_mask(tok, e.ids, e.mask)}\n\n")
        bar.set_postfix(reward=f"{st['reward']:.3f}", kl=f"{upd.get('kl', 0):.4f}", turns=f"{st['turns']:.1f}")
        # 8. evaluate and checkpoint
        done = step + 1
        if rank == 0 and cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps and eval_tasks:
            run_eval(f"GRPO step {done}")
        if cfg.save_every and (done % cfg.save_every == 0 or done == cfg.steps):
            save_checkpoint(out, done, policy, opt, sampler, {"results": results}, world_size, rank)

    if eval_tasks and cfg.steps > start:
        if rank == 0:
            run_eval(f"GRPO ({cfg.steps} steps)")
        # every rank: under FSDP, gathering the full weights for the checkpoint is a collective
        save_checkpoint(out, cfg.steps, policy, opt, sampler, {"results": results}, world_size, rank)
    save_pretrained(policy, tok, out / "final", world_size, rank)
    if rank == 0:
        if results:
            table = format_table(list(results.items()))
            (out / "results.md").write_text(table + "\n")
            print("\nHeld-out success (greedy, scripted user)" if cfg.user == "scripted" else "\nHeld-out success")
            print(table)
    dist_teardown(world_size)
    return results


if __name__ == "__main__":
    try:
        main()
        exit_now(int(os.environ.get("WORLD_SIZE", 1)))  # under torchrun: leave before gloo's exit-time abort
    except ConfigError as e:
        print(f"muarl: config error: {e}", file=sys.stderr)
        sys.exit(2)
    except (FileNotFoundError, ValueError) as e:
        print(f"muarl: {e}", file=sys.stderr)
        sys.exit(2)

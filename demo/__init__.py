"""The CPU demo, a user of muarl: what lets a laptop stand in for a GPU cluster and GPT-4o.

    python -m demo [flags]      the demo (__main__.py): what a laptop lacks prepared, then muarl.train
    __init__.py      TINY, the demo's preset, applied to every flag the command line leaves out
    train.py         the demo's own knobs (DemoConfig) and its run: the served and gated customer, the tiny
                     model with its drills and probed cold start, then muarl.train on them
    drills.py        copy drills, the tiny model's stand-in for pre-training; the cold start's probes
    customer.py      the store's customer model: its data, its training, its fidelity gate, the shipped model
    customer_model/  that model, trained once and committed (a fixed simulator, as the paper's GPT-4o is)
    baselines.py     rule policies (customer-blind and not) and the per-behaviour table of a run
    eval.py          `python -m demo.eval`: eval.py with the demo's worlds registered (a demo run's --model)
    worlds/          the demo's worlds, the shop and the store, registered in domains.DOMAINS on import
    tiny_model.py    a Qwen3-architecture model and BPE tokenizer built from nothing (--model tiny; the tests')

Nothing in the core needs this folder, nor imports it (tests/test_layout.py checks both); it is how the demo runs
MUA-RL on a CPU. Importing it registers its worlds, so every entry point of the demo knows --domains shop and store.
"""

from pathlib import Path

import demo.worlds  # noqa: F401  (registers "shop" and "store" in domains.DOMAINS)

SHIPPED = Path(__file__).resolve().parent / "customer_model"  # the committed customer model (--user_serve demo)

# The CPU preset: applied to every field the command line did not set. A 2-layer model built from
# scratch has no pre-training, so copy drills stand in for it, the cold start runs hot (lr 2e-3),
# and the KL anchor is off (the reference would be a random model). The store's tasks fit in 10
# turns of 64 tokens. Its customer is a language model, as in the paper: a tiny one trained for the
# store once and shipped (demo/customer_model), served by vLLM's OpenAI server, sampled at
# temperature 0.7 and gated at 95 % fidelity; every evaluation plays each held-out task twice
# against it (pass^1, pass^2). Drills, SFT and updates take 2 threads (the customer idles then),
# conversations 1. `--user scripted` plays the script instead. The seed is the world's too unless
# --synthetic_seed is given. 40 GRPO steps, with an evaluation every 20 (docs/log.md keeps how
# these numbers were chosen).
TINY = dict(
    model="tiny", domains="store", synthetic_train=1000, synthetic_test=200, tiny_hidden=128, tiny_layers=2, tiny_intermediate=512,
    tiny_vocab=512, tiny_split_digits=True, copy_warmup=2000, sft_epochs=4.0, sft_lr=2e-3, sft_batch=8,
    tasks_per_step=8, steps=40, lr=1e-4, kl_coef=0.0, temperature=1.0, top_p=0.9, max_turns=10, max_new_tokens=64,
    max_context=1024, micro_batch_tokens=512, tools_in_prompt=False, train_check_outputs=True, eval_every=20,
    threads=1, train_threads=2, user="llm", user_serve="demo", user_temperature=0.7, user_max_tokens=64,
    user_concurrency=64, user_gate=0.95, eval_trials=2, stage_band="0.25,0.65", sft_data="tasks",
    activation_checkpointing=False,
    # The demo's rollout engine is the trainer's own model in the same process: the sampler and the
    # trainer differ only by float rounding (~1e-7 a token), so there is nothing for the sampler's
    # correction to correct, and the demo keeps the paper's loss.
    tis_cap=0.0,
    # Lock-step rounds: the transformers engine's numerics move by ~1e-7 with the batch a turn lands in,
    # so only batches that are the same on every run keep a seed's run the same number for number
    # (bench/repro.py).
    lockstep=True,
)

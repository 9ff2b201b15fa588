"""The CPU demo (`python -m demo [flags]`): a user of muarl, as a GPU user is, on a laptop.

The core (muarl.py) trains a model folder against a customer endpoint. A laptop has neither a
pre-trained model nor a hosted customer, so the demo prepares both, then calls the same `muarl.train`:

    serve_customer   the store's customer model (demo/customer_model) served by vLLM's OpenAI server,
                     and gated: below --user_gate on the gate's conversations nothing is trained
    build_model      a tiny Qwen3-architecture model and BPE tokenizer, built from the training tasks' text
    cold_start       copy drills first (its stand-in for pre-training), then the cold start, probed and
                     trained again while the probes fail (drills.py)
    run              those three, then muarl.train on out/demo/cold-start against the served endpoint;
                     the cold start's held-out pass^1 is checked against --stage_band at the end

What the demo prepares lives in out/demo/: its settings (config.json, which --resume reads), the
log of the drills, the cold start and the customer's gate (log.jsonl), the tiny model after its
cold start, and the customer server's log; the tiny model as built is out/tiny-init. Its knobs (DemoConfig, the `demo` group of
--help) are the demo's own; TINY (demo/__init__.py) is its preset, applied to every flag the command
line leaves out.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from config import GROUPS, Config, flag
from demo import SHIPPED, TINY
from plumbing.flags import parse_flags
from plumbing.validate import first_problem

DEMO = "demo"


@dataclass
class DemoConfig(Config):
    lazy_rate: float = flag(-1.0, DEMO, "shop / store: how often the cold-start annotator writes the default "
                            "option, not the customer's (-1: the world's own)")
    stage_band: str = flag("", DEMO, "'LO,HI': the cold start's held-out pass^1 expected in [LO, HI] (outside "
                           "it the run says so by name)")
    tiny_hidden: int = flag(256, DEMO, "tiny model: hidden size")
    tiny_layers: int = flag(4, DEMO, "tiny model: decoder layers")
    tiny_intermediate: int = flag(768, DEMO, "tiny model: MLP width")
    tiny_vocab: int = flag(4096, DEMO, "tiny model: BPE vocabulary size (at most)")
    tiny_split_digits: bool = flag(False, DEMO, "tiny model: the tokenizer makes every digit its own token")
    copy_warmup: int = flag(0, DEMO, "steps (16 drills each) of copy drills before the cold start (drills.py)")
    copy_lr: float = flag(3e-3, DEMO, "learning rate of the copy drills (cosine)")
    lookup_draws: int = flag(1, DEMO, "store: SFT again if the cold start's probes fail, N times at most")


def band(text: str) -> tuple | None:
    """--stage_band 'LO,HI' -> (LO, HI); '' -> (); None when malformed."""
    try:
        lo, hi = (float(x) for x in text.split(",")) if text else (0.0, 1.0)
    except ValueError:
        return None
    return ((lo, hi) if text else ()) if 0 <= lo <= hi <= 1 else None


def parse(argv=None) -> DemoConfig:
    """The demo's settings: the core's flags and its own, TINY for every one not given."""
    cfg, given, resumed = parse_flags(argv, DemoConfig, TINY, groups={**GROUPS, DEMO: "the CPU demo's own"},
                                      prog="python -m demo", description="The CPU demo of MUA-RL: a tiny model "
                                      "learns against a served customer model", saved_as="demo/config.json")
    if not resumed:
        # The preset's customer is its world's own customer model: a run without that world keeps
        # the scripted customer unless --user says otherwise, and another customer chosen replaces
        # the served one.
        own = TINY["domains"] in cfg.domains.split(",")
        if "user" not in given and not own:
            cfg = dataclasses.replace(cfg, user="scripted")
        if "user_serve" not in given and (cfg.user != "llm" or cfg.user_base_url or not own):
            cfg = dataclasses.replace(cfg, user_serve="")
        if "eval_trials" not in given and cfg.user == "scripted":  # a script and a greedy agent: every trial alike
            cfg = dataclasses.replace(cfg, eval_trials=1)
        if "synthetic_seed" not in given:  # one seed, one world: another seed is other orders and tasks
            cfg = dataclasses.replace(cfg, synthetic_seed=cfg.seed)
    if cfg.user_serve == "demo":  # the shipped customer model
        cfg = dataclasses.replace(cfg, user_serve=str(SHIPPED))
    first_problem([
        (cfg.model == "tiny" or os.path.isfile(os.path.join(cfg.model, "config.json")),
         f"--model: the demo builds its tiny model (tiny), or starts from a folder of one (e.g. a run's "
         f"cold-start/); got {cfg.model!r}"),
        *[(getattr(cfg, k) >= 0, f"--{k} must be >= 0, got {getattr(cfg, k)}") for k in ("copy_warmup", "copy_lr",
                                                                                       "lookup_draws")],
        *[(getattr(cfg, k) > 0, f"--{k} must be positive, got {getattr(cfg, k)}")
          for k in ("tiny_hidden", "tiny_layers", "tiny_vocab", "tiny_intermediate")],
        (cfg.lazy_rate == -1 or 0 <= cfg.lazy_rate <= 1, f"--lazy_rate must be in [0, 1] (or -1), got {cfg.lazy_rate}"),
        (band(cfg.stage_band) is not None, f"--stage_band must be 'LO,HI' with 0 <= LO <= HI <= 1, got "
                                           f"{cfg.stage_band!r}"),
    ])
    return cfg


# --------------------------------------------------------------------------------------------------
# What a laptop lacks, prepared before muarl.train: a served customer model, and a tiny policy model


def serve_customer(cfg, worlds, tasks: list, folder: Path, log):
    """The customer model (--user_serve) served by vLLM's OpenAI server and gated (demo/customer.py);
    None when the run's customer is another one (--user)."""
    from demo.customer import ServedCustomer
    from plumbing.serve import customer_settings
    from user_sim import make_user

    if not cfg.user_serve:
        return None
    served = ServedCustomer(cfg.user_serve, folder, gate=cfg.user_gate, make_llm=lambda **kw: make_user("llm", **kw),
                            **customer_settings(cfg))
    served.check(tasks, worlds)
    served.start(tasks, log)  # serves it, checks its endpoint, plays the gate
    return served


def build_model(cfg, worlds, out):
    """out/tiny-init: a tiny model and tokenizer from the training tasks' text (built once per run
    folder); or --model's folder (a run's cold-start/, to train it again against another customer)."""
    from demo.tiny_model import build_tiny

    if cfg.model != "tiny":
        return cfg.model
    path = out / "tiny-init"
    if not (path / "config.json").exists():
        texts = [text for w in worlds.values()
                 for text in [w.rules] + [json.dumps(t.expert) for t in w.tasks("train")[:400] if t.expert]]
        build_tiny(path, seed=cfg.seed, texts=texts, hidden=cfg.tiny_hidden, layers=cfg.tiny_layers,
                   split_digits=cfg.tiny_split_digits, vocab_size=cfg.tiny_vocab, intermediate=cfg.tiny_intermediate)
    return path


def cold_start(cfg, worlds, train_tasks: list, folder: Path, log) -> Path:
    """The tiny model drilled and cold-started: a random model cannot copy yet, so copy drills come
    first (its stand-in for pre-training), then the cold start on the tasks' expert conversations,
    trained again while the store's probes fail (drills.until_lookup). Saved to `folder`/cold-start,
    the model muarl.train starts from."""
    import torch

    import sft
    from demo.drills import copy_warmup, until_lookup, words_of
    from plumbing.checkpoint import save_pretrained
    from plumbing.fsdp import place
    from plumbing.models import load_policy

    placed, device = place(cfg, 0, 1)[:2]  # (the dtype, the rows and the threads muarl.train will use)
    model, tok = load_policy(str(build_model(cfg, worlds, Path(cfg.out_dir))), device=device)
    common = dict(seed=cfg.seed, bf16=placed.dtype == "bfloat16", micro_batch_tokens=placed.micro_batch_tokens,
                  chunk_size=cfg.logprob_chunk)
    # The policy alone computes now, so it may take the threads the customer's requests use later.
    torch.set_num_threads(cfg.train_threads or placed.threads)
    if cfg.copy_warmup > 0:
        copy_warmup(model, tok, cfg.copy_warmup, cfg.copy_lr, words_of(train_tasks), log=log, **common)
    convs = sft.conversations(cfg.sft_data, train_tasks, seed=cfg.seed, tools=cfg.tools_in_prompt)
    examples = sft.render_examples(tok, convs, worlds)
    train = dict(batch_size=cfg.sft_batch, lr=cfg.sft_lr, **common)
    if cfg.copy_warmup > 0:
        until_lookup(model, tok, examples, cfg.sft_epochs, worlds, train_tasks, cfg.tools_in_prompt,
                     cfg.lookup_draws, log, **train)
    else:
        sft.train(model, examples, epochs=cfg.sft_epochs, log=log, **train)
    torch.set_num_threads(placed.threads)
    save_pretrained(model, tok, folder / "cold-start", world_size=1, rank=0)
    return folder / "cold-start"


def check_stage(cfg, results: dict, log) -> None:
    """The cold start's held-out pass^1 against --stage_band: a start outside it is named (and
    logged in the demo's log)."""
    m = results.get("cold start")
    if m is None or not band(cfg.stage_band):
        return
    lo, hi = band(cfg.stage_band)
    if not lo <= m["pass^1"] <= hi:
        print(f"[stage] the cold start's held-out pass^1 {100 * m['pass^1']:.1f} % was outside --stage_band "
              f"{cfg.stage_band}")
        log({"phase": "stage", "stage": "cold_start", "pass^1": m["pass^1"], "ok": False})


def run(cfg: DemoConfig) -> dict:
    """The demo: the customer served and gated, the tiny model built, drilled and cold-started (the
    log of both in out/demo/log.jsonl), then the same muarl.train a GPU user runs, on that model folder
    against that customer endpoint."""
    import random

    import numpy as np
    import torch

    import shutil
    import time

    import muarl
    from domains import load_worlds, task_sets
    from plumbing import startup
    from plumbing.flags import save_config
    from config import validate
    from plumbing.fsdp import decide_on_rank0, dist_setup
    from plumbing.serve import customer_for
    from user_sim import make_user
    from plumbing.runlog import RunLog

    out = Path(cfg.out_dir)
    folder = out / "demo"
    rank, world_size = dist_setup(cfg.offload)  # (under torchrun: rank 0 prepares, every rank trains)
    validate(cfg, world_size, model_given=False)  # a setting that cannot work is refused before any work
    # A --resume needs a usable checkpoint: without one it stops here, before any work.
    found = startup.resume_point(cfg.resume, out, rank, world_size)
    random.seed(cfg.seed)  # as muarl.train seeds them: the worlds drawn are the run's
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    worlds = load_worlds(cfg)
    train_tasks, eval_tasks = task_sets(cfg, worlds)
    if not cfg.user_serve:  # another customer is checked now, as muarl.train will, before any work
        customer_for(cfg, make_user, out, rank, world_size).check(
            train_tasks + eval_tasks[: cfg.eval_tasks or None], worlds)
    # A fresh run keeps an earlier run's preparation beside it, never appends to its log; a
    # preparation that fails leaves nothing of its own behind.
    if found is None and rank == 0 and (folder / "log.jsonl").exists():
        k = 1 + sum(1 for _ in out.glob("demo.previous-*"))
        folder.rename(out / f"demo.previous-{k}")
    made = [p for p in (out, folder, out / "tiny-init") if not p.exists()]
    before = {p.name for p in out.iterdir()} if out.is_dir() else set()
    served, log = None, None
    try:
        def prepare():  # rank 0 alone; under torchrun every rank then reads what it made
            nonlocal served, log
            folder.mkdir(parents=True, exist_ok=True)
            save_config(folder, cfg)  # the demo's settings: --resume reads them here
            log = RunLog(folder / "log.jsonl")
            served = serve_customer(cfg, worlds, train_tasks + eval_tasks[: cfg.eval_tasks or None], folder, log)
            start = folder / "cold-start"
            if found is None:  # (a resumed run's weights come from its checkpoint)
                start = cold_start(cfg, worlds, train_tasks, folder, log) if cfg.sft_epochs > 0 else \
                    build_model(cfg, worlds, out)
            elif not (start / "config.json").is_file():
                start = build_model(cfg, worlds, out)
            return start, {} if served is None else dict(
                user="llm", user_serve="", user_base_url=served.base_url, user_api_key=served.server.api_key,
                user_model=served.server.name, user_thinking=bool(served.llm_settings.get("thinking")))

        start, endpoint = decide_on_rank0(prepare, world_size)
        results = muarl.train(dataclasses.replace(
            cfg, model=str(start), sft_epochs=0.0, start_name="cold start" if cfg.sft_epochs > 0 else "",
            **endpoint))
    except BaseException:
        if served is not None:
            served.close()
        # A start that failed (muarl.train left the folder as it found it) leaves nothing of the
        # demo's either; a run that failed later keeps what it prepared, for --resume.
        now = {p.name for p in out.iterdir()} if out.is_dir() else set()
        if found is None and rank == 0 and now - before <= {folder.name, "tiny-init"}:
            for p in reversed(made):
                for _ in range(3):  # (a server that is stopping may still write its log)
                    shutil.rmtree(p, ignore_errors=True)
                    if not p.exists():
                        break
                    time.sleep(0.5)
        raise
    if served is not None:
        served.close()
    if rank == 0:
        check_stage(cfg, results, log)
    return results


def main(argv=None) -> dict:
    """`python -m demo ARGS` as a function."""
    from plumbing.validate import early

    cfg = parse(argv)
    early(cfg)
    return run(cfg)


if __name__ == "__main__":
    raise SystemExit("run the demo as `python -m demo`")

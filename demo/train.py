"""The CPU demo's run: muarl.train with the demo's kit and knobs (`python -m demo [flags]`).

The core (muarl.py) trains any model folder against any customer. A laptop has neither a pre-trained
model nor a hosted customer, so this kit stands in for both, beside the core and through its
`muarl.Kit`:

    build_model   a tiny Qwen3-architecture model and BPE tokenizer, built from the training tasks' text
    cold_start    copy drills first (its stand-in for pre-training), then the cold start, probed (drills.py)
    customer      the store's customer model (demo/customer_model), served by vLLM's OpenAI server and gated
    started       the cold start's held-out pass^1 checked against --stage_band

Its knobs (DemoConfig, the `demo` group of --help) are the demo's own; TINY (demo/__init__.py) is
its preset, applied to every flag the command line leaves out.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

from config import GROUPS, Config, flag
from demo import SHIPPED, TINY
from plumbing.flags import parse_flags
from plumbing.validate import first_problem

DEMO = "demo"


@dataclass
class DemoConfig(Config):
    lazy_rate: float = flag(-1.0, DEMO, "shop / store: how often the cold-start annotator writes the default "
                            "option, not the customer's (-1: the world's own)")
    user_gate: float = flag(0.95, DEMO, "the served customer's lowest fidelity on the gate's held-out "
                            "conversations; below it the run trains nothing and exits 2")
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
                                      "learns against a served customer model")
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
        (0 <= cfg.user_gate <= 1, f"--user_gate must be in [0, 1], got {cfg.user_gate}"),
        (band(cfg.stage_band) is not None, f"--stage_band must be 'LO,HI' with 0 <= LO <= HI <= 1, got "
                                           f"{cfg.stage_band!r}"),
    ])
    return cfg


# --------------------------------------------------------------------------------------------------
# The kit


def build_model(cfg, worlds, out):
    """out/tiny-init: a tiny model and tokenizer from the training tasks' text (built once per run
    folder); or --model's folder (a run's cold-start/, to train it again against another customer)."""
    from plumbing.tiny_model import build_tiny

    if cfg.model != "tiny":
        return cfg.model
    path = out / "tiny-init"
    if not (path / "config.json").exists():
        texts = [text for w in worlds.values()
                 for text in [w.rules] + [json.dumps(t.expert) for t in w.tasks("train")[:400] if t.expert]]
        build_tiny(path, seed=cfg.seed, texts=texts, hidden=cfg.tiny_hidden, layers=cfg.tiny_layers,
                   split_digits=cfg.tiny_split_digits, vocab_size=cfg.tiny_vocab, intermediate=cfg.tiny_intermediate)
    return path


def customer(cfg, out, rank=0, world_size=1):
    """The served, gated customer model (--user_serve), or the row of user_sim.USERS --user names."""
    from demo.customer import ServedCustomer
    from plumbing.serve import customer_for, customer_settings

    if cfg.user_serve:
        return ServedCustomer(cfg.user_serve, out, gate=cfg.user_gate, rank=rank, world_size=world_size,
                              **customer_settings(cfg))
    return customer_for(cfg, out, rank, world_size)


def cold_start(run, model, examples, **train):
    """A random model cannot copy yet: copy drills first, then the cold start until the store's
    probes take."""
    import sft
    from demo.drills import copy_warmup, until_lookup, words_of

    cfg = run.cfg
    if cfg.copy_warmup <= 0:
        return sft.train(model, examples, **train)
    common = {k: train[k] for k in ("world_size", "rank", "seed", "bf16", "micro_batch_tokens", "chunk_size")}
    copy_warmup(model, run.tok, cfg.copy_warmup, cfg.copy_lr, words_of(run.train_tasks), log=run.log, **common)
    return until_lookup(run, model, examples, **train)


def started(run) -> None:
    """Not the start the run expects: named now, not in the last table."""
    cfg = run.cfg
    name, m = next(reversed(run.results.items()))
    if name != "cold start" or not band(cfg.stage_band):
        return
    lo, hi = band(cfg.stage_band)
    if not lo <= m["pass^1"] <= hi:
        print(f"[stage] the cold start's held-out pass^1 {100 * m['pass^1']:.1f} % is outside --stage_band "
              f"{cfg.stage_band}")
        run.log({"phase": "stage", "stage": "cold_start", "pass^1": m["pass^1"], "ok": False})


def kit(cfg):
    import muarl

    return muarl.Kit(build_model=build_model, customer=customer, cold_start=cold_start,
                     eval_untrained=not cfg.copy_warmup, started=started)


def main(argv=None) -> dict:
    """`python -m demo ARGS` as a function."""
    import muarl

    cfg = parse(argv)
    muarl.early(cfg)
    return muarl.train(cfg, kit(cfg))


if __name__ == "__main__":
    raise SystemExit("run the demo as `python -m demo`")

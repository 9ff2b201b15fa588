"""A configuration that cannot work is refused before any work, in one line (ConfigError, exit
status 2).

`field_problems` holds the rules of single fields (ranges, choices, paths) and needs only the
standard library:
muarl.py and eval.py run them before torch loads. config.validate adds what needs the tables
(domains.DOMAINS, user_sim.USERS, grpo's ADVANTAGES and REWARDS: a new row is a new choice) and the
rules between fields.
"""

from __future__ import annotations

import dataclasses
import os

from plumbing.flags import ConfigError

# Ranges of single fields (a field absent from the object checked is skipped: eval.py shares only some)
NONNEG = ("steps", "grad_clip", "temperature", "clip_high", "kl_coef", "weight_decay", "eval_tasks", "eval_every",
          "save_every", "micro_batch_tokens", "user_down_s", "sft_epochs", "threads", "train_threads",
          "turn_bonus", "user_temperature", "user_retries", "user_backoff", "synthetic_train", "synthetic_test",
          "sft_lr", "plan", "tis_cap")
POSITIVE = ("lr", "mini_batches", "max_new_tokens", "max_context", "user_max_tokens", "max_turns", "logprob_chunk",
            "sft_batch", "synthetic_users", "user_timeout", "user_concurrency", "eval_trials")
CHOICES = {"task_source": ("train", "generated"), "malformed": ("end", "observe"), "engine": ("auto", "hf", "vllm"),
           "logger": ("none", "tensorboard", "wandb"), "dtype": ("auto", "float32", "bfloat16"),
           "user_prompt": ("auto", "tau2", "muarl")}


def model_problem(name: str) -> str | None:
    """What is wrong with a --model value, or None: a model folder (with config.json) or a hub id
    (owner/name:
    fetched later, one line if it cannot be). A path to nothing is caught here, before any work."""
    if name == "tiny":
        return "--model tiny is the CPU demo's model: run `python -m demo` (its own flags: python -m demo --help)"
    if os.path.isfile(os.path.join(os.path.expanduser(name), "config.json")):
        return None
    if os.path.isdir(os.path.expanduser(name)):
        return f"--model {name}: the folder holds no config.json (not a saved model)"
    bad = name.startswith(("/", ".", "~")) or name.count("/") != 1 or not name  # not owner/name: a path
    return f"--model {name!r}: no such model folder (and not a hub id like Qwen/Qwen3-8B)" if bad else None


def sft_data_problem(path: str) -> str | None:
    """What is wrong with an --sft_data JSONL file, or None: it must be a readable text file of at
    least one conversation, one JSON object a line, each with a "messages" list holding an assistant
    turn (the tokens the cold start trains). Read in full now, so a bad line is refused before the
    model loads, not after the untrained model's evaluation."""
    import json

    if not os.path.exists(path):
        return f"--sft_data {path}: no such file"
    if not os.path.isfile(path):
        return f"--sft_data {path}: a folder, not a JSONL file of conversations"
    n = 0
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                msgs = row.get("messages") if isinstance(row, dict) else None
                if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m for m in msgs):
                    return f'--sft_data {path}:{i}: not a conversation (a JSON object with a "messages" list)'
                if not any(m["role"] == "assistant" for m in msgs):
                    return f"--sft_data {path}:{i}: a conversation with no assistant turn (nothing to train)"
                n += 1
    except json.JSONDecodeError as e:
        return f"--sft_data {path}:{i}: not JSON ({e.msg})"
    except (OSError, UnicodeDecodeError) as e:
        return f"--sft_data {path}: cannot be read as text ({getattr(e, 'strerror', None) or e})"
    return None if n else f"--sft_data {path}: no conversations in it (an empty file?)"


def row_note(cfg) -> str | None:
    """One line on --micro_batch_tokens when it is below the longest conversation (--max_context): an
    episode longer than a row is not cut, it is trained in a row of its own (long_rows in the log)."""
    rows, context = getattr(cfg, "micro_batch_tokens", 0), getattr(cfg, "max_context", 0)
    return None if not rows or rows >= context else (
        f"note: --micro_batch_tokens {rows} is below --max_context {context}: an episode longer than {rows} tokens "
        f"is trained in a row of its own (counted as long_rows in log.jsonl)")


def field_problems(cfg, names) -> list[tuple[bool, str]]:
    """(holds, what to say otherwise) for each single-field rule on the fields `names` of `cfg` (any
    object with them). NaN fails every comparison: `--kl_coef nan` is refused like `--kl_coef -1`."""
    v = {k: getattr(cfg, k) for k in names if hasattr(cfg, k)}
    return [*[(v[k] in CHOICES[k], f"--{k} must be one of {', '.join(CHOICES[k])}, got {v[k]!r}")
              for k in v if k in CHOICES],
            *[(v[k] >= 0, f"--{k} must be >= 0, got {v[k]}") for k in v if k in NONNEG],
            *[(v[k] > 0, f"--{k} must be positive, got {v[k]}") for k in v if k in POSITIVE],
            *[(0 < v[k] <= 1, f"--top_p must be in (0, 1], got {v[k]}") for k in v if k == "top_p"],
            *[(v[k] < v["max_context"], "--max_new_tokens must be smaller than --max_context (a turn needs room)")
              for k in v if k == "max_new_tokens" and "max_context" in v],
            *[(False, m) for k in v if k == "sft_data" and v[k] not in ("", "generated", "tasks")
              for m in [sft_data_problem(v[k])] if m],
            *[(not v[k] or not os.path.exists(v[k]) or os.path.isdir(v[k]),
               f"--out_dir {v[k]}: a file stands there, not a folder") for k in v if k == "out_dir"],
            *[(not v[k] or v[k] >= v["max_new_tokens"], f"--micro_batch_tokens {v[k]} cannot hold one turn of "
               f"--max_new_tokens {v['max_new_tokens']}: every episode would be a row of its own (0: automatic)")
              for k in v if k == "micro_batch_tokens" and "max_new_tokens" in v],
            *[(not v[k] or os.path.exists(v[k]), f"--{k} {v[k]}: no such folder") for k in v if k == "data_dir"],
            *[(not v[k] or os.path.isfile(os.path.join(v[k], "config.json")),
               f"--user_serve {v[k]}: no model folder there (no config.json)") for k in v if k == "user_serve"],
            *[(0 < v[k] < 1, f"--{k} must be in (0, 1), got {v[k]}") for k in v if k in ("engine_memory",
                                                                                         "user_memory")],
            *[(0 <= v[k] < 1, f"--clip_low must be in [0, 1), got {v[k]}") for k in v if k == "clip_low"],
            *[(0 <= v[k] <= 1, f"--user_gate must be in [0, 1], got {v[k]}") for k in v if k == "user_gate"],
            *[(v[k] == 0 or v[k] >= 1, f"--tis_cap must be 0 (off) or at least 1 (a cap below 1 shrinks every "
               f"weight), got {v[k]}") for k in v if k == "tis_cap"]]


def first_problem(checks) -> None:
    """Raise ConfigError with the first check that does not hold (checks: (holds, message) pairs, in
    order)."""
    if (message := next((m for ok, m in checks if not ok), None)) is not None:
        raise ConfigError(message)


def early(cfg, names=None) -> None:
    """The single-field rules, before any heavy import (muarl.py, eval.py run this first)."""
    first_problem(field_problems(cfg, names or [f.name for f in dataclasses.fields(cfg)]))

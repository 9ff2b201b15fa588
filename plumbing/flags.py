"""From the command line to a settings dataclass: grouped flags, a --config file, --resume, one-line
errors.

Every field of the dataclass (config.Config, or a subclass such as the CPU demo's) is a flag of the
same name and type, in the --help group its metadata names. Where a value comes from, last wins: the
defaults (or a `preset` of them), `--config run.json` (JSON or YAML of field: value), the command
line. `--resume` starts from the run's saved config.json instead of the defaults: a flag given again
must match it unless it is one a resumed run may change (RESUMABLE, e.g. --steps) or is named in
--allow_change. A bad value is one line that names the flag and its type (ConfigError), never
argparse's page of usage. Secrets (config.SECRETS) are never written or printed: `public(cfg)`
blanks them. Only the standard library is imported: --help is instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path


class ConfigError(ValueError):
    """A configuration that cannot work: reported as one line at start, before anything expensive."""


# What --resume may change without --allow_change; the rest shapes the training and must match the saved run.
RESUMABLE = {"steps", "resume", "eval", "eval_tasks", "eval_every", "save_every", "threads", "train_threads",
             "logger", "config", "allow_change", "preflight", "user_base_url", "user_api_key", "user_down_s",
             "allow_insecure_http", "plan_override", "user_host"}
SECRETS = ("user_api_key",)


def public(cfg) -> dict:
    """The settings as files and logs show them: secrets blanked ("" = not given: a resume asks
    again)."""
    return {**dataclasses.asdict(cfg), **{k: "" for k in SECRETS if hasattr(cfg, k)}}


def _bool(s: str) -> bool:
    # argparse's type=bool would read "false" as True (a non-empty string): spell the words out
    if s.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return s.lower() in ("1", "true", "yes", "on")
    raise argparse.ArgumentTypeError(f"expected true/false, got {s!r}")


_bool.__name__ = "true/false"  # what argparse's one line says the flag takes


def add_flags(p: argparse.ArgumentParser, cls, names=None, defaults: dict | None = None, groups=None,
              shown: dict | None = None) -> None:
    """Declare the fields `names` (all by default) of dataclass `cls` as flags of `p`, in argument
    groups (`groups`: name -> description, in --help order). `defaults`: a caller's own; else None
    ("not given"). `shown`: the defaults --help states, where they are not the dataclass's (a
    preset's, eval.py's)."""
    sections = {g: p.add_argument_group(g, what) for g, what in (groups or {}).items()}
    for f in dataclasses.fields(cls):
        if names is not None and f.name not in names:
            continue
        # a bool flag alone means true (`--resume`); `--resume false` / `--resume true` say it explicitly
        kind = dict(type=_bool, nargs="?", const=True, metavar="BOOL") if type(f.default) is bool else \
            dict(type=type(f.default), metavar=type(f.default).__name__.upper())
        where = sections.get(f.metadata.get("group"), p)
        default = (defaults or {}).get(f.name)
        said = {**(shown or {}), **(defaults or {})}.get(f.name, f.default)
        where.add_argument(f"--{f.name}", default=default, help=f"{f.metadata['help']} [{said!r}]", **kind)


def one_line_errors(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`p` with argparse's usage page replaced by one line: 'argument --lr: invalid float value:
    'abc''."""
    def error(message):
        raise ConfigError(message)

    p.error = error
    return p


def read_settings(path: str, cls) -> dict:
    """A --config file: {field: value} in JSON (or YAML), each checked against the fields and their
    types."""
    types = {f.name: type(f.default) for f in dataclasses.fields(cls)}
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


def parse_config(argv, cls, preset: dict | None = None, **kw):
    """The settings `argv` asks for, as a `cls` instance. `preset`: defaults of the caller's own
    (the CPU demo's), applied to every field neither the command line nor a --config file set."""
    return parse_flags(argv, cls, preset, **kw)[0]


def parse_flags(argv, cls, preset: dict | None = None, groups=None, prog: str | None = None,
                description: str = "MUA-RL: GRPO with a simulated customer in the loop", saved_as: str = "config.json"):
    """(settings, the names given on the command line or in --config, resumed from a saved run or
    not). `saved_as`: where in out_dir --resume finds the saved settings (the CPU demo keeps its own)."""
    p = one_line_errors(argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False))
    add_flags(p, cls, defaults=None, groups=groups, shown=preset)
    # Flags default to None, so "not given" can be told from "given the default value": the preset
    # fills only what the command line (and a --config file under it) left out.
    given = {k: v for k, v in vars(p.parse_args(sys.argv[1:] if argv is None else argv)).items()
             if v is not None}
    given = {**read_settings(given["config"], cls), **given} if given.get("config") else given
    base = dataclasses.replace(cls(), **(preset or {}))
    saved_file = Path(given.get("out_dir", base.out_dir)) / saved_as
    if given.get("resume") and saved_file.is_file():  # --resume: the saved run's settings, not the defaults
        saved = json.loads(saved_file.read_text())
        free = RESUMABLE | set(given.get("allow_change", "").split(","))
        for k, v in given.items():
            if k in saved and k not in free and saved[k] != v:
                raise ConfigError(f"--{k} {v!r} differs from the resumed run's {saved[k]!r} ({saved_file}): "
                                  f"drop the flag to resume as saved, or allow it with --allow_change {k}")
        known = {f.name for f in dataclasses.fields(cls)}  # a field since removed is ignored
        base = dataclasses.replace(cls(), **{k: v for k, v in saved.items() if k in known})
        return dataclasses.replace(base, **given), set(given), True
    return dataclasses.replace(base, **given), set(given), False


def save_config(out: Path, cfg) -> None:
    """Write out/config.json; a different one already there is kept as config.N.json, and that is
    said."""
    path, text = Path(out) / "config.json", json.dumps(public(cfg), indent=2)  # no secret on disk
    if path.is_file() and path.read_text() != text:
        n = next(i for i in range(1, 10**6) if not path.with_name(f"config.{i}.json").exists())
        path.rename(path.with_name(f"config.{n}.json"))
        print(f"[config] {path} changed: the previous one is kept as config.{n}.json", flush=True)
    path.write_text(text)


def run_cli(entry, name: str) -> None:
    """A training entry point's exits: 0 done; 2 bad input, in one line (ConfigError,
    PreflightError, ServeError, a missing file: a ValueError or an OSError); 3 stopped on purpose,
    checkpoint saved (RunStopped); 130 Ctrl-C, in one line (the requests in flight were given up,
    chat_client.STOP; a served customer is stopped at exit). Under torchrun every exit, a rank told
    to stop quietly (SystemExit) included, leaves through fsdp.exit_now: gloo's exit-time abort
    would turn it into a crash."""
    import os

    from plumbing.fsdp import exit_now
    from plumbing.preflight import RunStopped

    try:
        entry()
        code = 0
    except (ImportError, OSError, ValueError) as e:
        print(f"{name}: {'config error: ' if isinstance(e, ConfigError) else ''}{e}", file=sys.stderr)
        code = 2
    except RunStopped as e:
        print(f"{name}: {e}", file=sys.stderr)
        code = 3
    except KeyboardInterrupt:
        print(f"{name}: stopped (Ctrl-C); the checkpoints written so far are kept: --resume continues from the "
              "newest", file=sys.stderr)
        code = 130
    except SystemExit as e:  # (--help, --plan, the ranks that stop quietly while rank 0 says why)
        if "WORLD_SIZE" not in os.environ:
            raise
        if isinstance(e.code, str):  # sys.exit("why") prints its text and exits 1
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else 1 if e.code else 0
    exit_now(int(os.environ.get("WORLD_SIZE", 1)), code)

"""The settings: every bad value of a numeric or choice flag is one ConfigError naming the flag, before any work.

The core's flags are config.Config's, parsed by plumbing.flags and checked by plumbing.validate; the CPU demo's
(demo.train.parse) are the same flags with the TINY preset under them, plus the demo's own knobs. NaN is the case a
plain `x < 0` check lets through (every comparison with NaN is False), so it is in every row. The command lines
(config.py, muarl.py, eval.py, python -m demo) answer --help and a bad value at once, before torch loads.
"""

import ast
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from config import GROUPS, Config
from demo import SHIPPED, TINY
from demo.train import DemoConfig
from demo.train import parse as demo_parse
from evaluation.flags import SHARED
from evaluation.flags import parse_args as eval_parse
from plumbing.flags import ConfigError, parse_config, save_config
from config import validate

REPO = Path(__file__).resolve().parents[1]


def core(argv):
    """muarl.py's parse: the paper's recipe for every flag not given."""
    return parse_config(argv, Config, groups=GROUPS, prog="muarl.py")


def demo(argv):
    """python -m demo's parse, checked as the demo's run checks it (it builds its own model: no --model)."""
    cfg = demo_parse(argv)
    validate(cfg, model_given=False)
    return cfg


BAD = {
    # flag: bad values (NaN everywhere a float is taken); the core's and the demo's alike
    "grad_clip": ["-1", "nan"], "kl_coef": ["-0.1", "nan"], "temperature": ["-1", "nan"], "top_p": ["0", "1.5", "nan"],
    "lr": ["0", "-1e-6", "nan"], "clip_low": ["1", "-0.1", "nan"], "clip_high": ["-0.1", "nan"],
    "steps": ["-1"], "eval_tasks": ["-5"], "eval_every": ["-1"], "save_every": ["-1"], "threads": ["-2"],
    "train_threads": ["-1"],
    "sft_epochs": ["-1", "nan"], "sft_lr": ["-1", "nan"], "weight_decay": ["-0.01", "nan"],
    "turn_bonus": ["-0.5", "nan"], "user_temperature": ["nan"], "sft_batch": ["0"],
    "max_turns": ["0"], "max_new_tokens": ["0"], "logprob_chunk": ["0"], "micro_batch_tokens": ["-1"],
    "dtype": ["fp8"], "engine": ["tpu"], "advantage": ["ppo"], "malformed": ["ignore"], "user": ["human"],
    "task_source": ["all"], "group_size": ["1"], "user_prompt": ["tau3"], "engine_memory": ["1", "0", "nan"],
    "user_memory": ["1", "0", "nan"], "user_gate": ["1.5", "nan"],
}
CASES = [(flag, value) for flag, values in BAD.items() for value in values]
# the demo's own knobs: DemoConfig's, not the core's
DEMO_BAD = {"copy_lr": ["nan", "-1"], "lazy_rate": ["1.5", "nan"], "tiny_hidden": ["0"], "tiny_layers": ["0"],
            "tiny_vocab": ["0"], "tiny_intermediate": ["0"], "copy_warmup": ["-1"], "lookup_draws": ["-1"]}
DEMO_CASES = [(flag, value) for flag, values in DEMO_BAD.items() for value in values]


@pytest.mark.parametrize("flag,value", CASES, ids=[f"{f}={v}" for f, v in CASES])
def test_bad_value_is_one_clear_error(flag, value):
    with pytest.raises(ConfigError, match=flag):
        validate(core([f"--{flag}={value}"]))  # "=": argparse reads "-1" alone as a flag
    with pytest.raises(ConfigError, match=flag):  # the demo's preset must not paper over a bad value
        demo([f"--{flag}={value}"])


@pytest.mark.parametrize("flag,value", DEMO_CASES, ids=[f"demo-{f}={v}" for f, v in DEMO_CASES])
def test_a_demo_knobs_bad_value_is_one_clear_error_and_the_core_has_no_such_flag(flag, value):
    with pytest.raises(ConfigError, match=flag) as e:
        demo([f"--{flag}={value}"])
    assert "\n" not in str(e.value)
    assert flag in {f.name for f in dataclasses.fields(DemoConfig)} - {f.name for f in dataclasses.fields(Config)}
    with pytest.raises(ConfigError, match=f"unrecognized arguments: --{flag}"):
        core([f"--{flag}={value}"])


def test_the_defaults_are_valid():
    validate(core([]))  # the paper's defaults (a hub id for --model: fetched later)
    demo([])  # and the CPU preset


def test_the_defaults_are_the_papers_recipe():
    cfg = core([])
    assert (cfg.model, cfg.domains, cfg.user, cfg.task_source) == ("Qwen/Qwen3-8B", "retail,airline", "llm", "train")
    assert (cfg.sft_epochs, cfg.sft_batch, cfg.sft_lr, cfg.sft_data) == (2.0, 128, 5e-6, "generated")
    assert (cfg.group_size, cfg.tasks_per_step, cfg.lr, cfg.kl_coef, cfg.max_turns) == (8, 32, 1e-6, 0.001, 30)
    assert (cfg.user_prompt, cfg.user_memory) == ("auto", 0.2)
    assert cfg == Config()  # nothing on the command line: the dataclass's own defaults


def test_the_core_refuses_the_demos_model_with_a_hint_and_the_demo_takes_only_its_own(tmp_path):
    with pytest.raises(ConfigError, match=r"--model tiny is the CPU demo's model: run `python -m demo`") as e:
        validate(core(["--model", "tiny"]))
    assert "\n" not in str(e.value)
    # the demo builds its tiny model, or starts from a folder of one (a run's cold-start/); a hub id is neither
    with pytest.raises(ConfigError, match=r"--model: the demo builds its tiny model \(tiny\), or starts from a "
                                          r"folder of one .* got 'Qwen/Qwen3-8B'") as e:
        demo(["--model", "Qwen/Qwen3-8B"])
    assert "\n" not in str(e.value)
    folder = tmp_path / "cold-start"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    cfg = demo(["--model", str(folder)])
    from demo.train import build_model

    assert cfg.model == str(folder) and str(build_model(cfg, {}, tmp_path / "run")) == str(folder)  # taken as it is
    assert not (tmp_path / "run").exists()  # nothing built


def test_the_demo_preset_fills_what_the_command_line_leaves_out():
    cfg = demo(["--steps", "3"])
    assert cfg.steps == 3 and isinstance(cfg, DemoConfig)
    # every other field is TINY's; --user_serve demo is the shipped customer model's folder
    rest = [k for k in TINY if k not in ("steps", "user_serve")]
    assert TINY["steps"] != 3 and {k: getattr(cfg, k) for k in rest} == {k: TINY[k] for k in rest}
    assert cfg.user_serve == str(SHIPPED)


# ---------------------------------------------------------------------------------------------------------------
# A config file under the command line; --resume restores the saved configuration


def test_config_file_values_and_command_line_overrides(tmp_path):
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"lr": 3e-6, "steps": 7, "domains": "shop", "eval": False}))
    cfg = core(["--config", str(run), "--steps", "9"])
    assert (cfg.lr, cfg.steps, cfg.domains, cfg.eval) == (3e-6, 9, "shop", False)  # the command line wins
    assert cfg.group_size == Config().group_size  # the defaults fill the rest
    tiny = demo_parse(["--config", str(run)])
    # the file beats the preset; the preset fills the rest
    assert tiny.steps == 7 and tiny.copy_warmup == TINY["copy_warmup"]
    yaml = pytest.importorskip("yaml")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"group_size": 4}))
    assert core(["--config", str(tmp_path / "run.yaml")]).group_size == 4


@pytest.mark.parametrize("content,phrase", [({"learning_rate": 1e-6}, "'learning_rate' is not a setting"),
                                            ({"steps": "ten"}, "'steps' is not a setting of type <class 'int'>"),
                                            ({"copy_lr": 1e-3}, "'copy_lr' is not a setting"),  # the demo's alone
                                            ("{not json", "Expecting property name"), (None, "No such file")])
def test_a_bad_config_file_is_one_error(tmp_path, content, phrase):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ConfigError, match=re.escape(phrase)):
        core(["--config", str(path)])


def test_resume_restores_the_saved_configuration(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    first = core(["--out_dir", str(out), "--lr", "3e-6", "--group_size", "4", "--steps", "5"])
    save_config(out, first)
    resumed = core(["--out_dir", str(out), "--resume", "--steps", "8"])  # --steps may change
    assert (resumed.lr, resumed.group_size, resumed.steps, resumed.resume) == (3e-6, 4, 8, True)
    assert core(["--out_dir", str(out), "--resume", "--lr", "3e-6"]).lr == 3e-6  # given again, the same
    with pytest.raises(ConfigError, match="--lr 1e-05 differs from the resumed run's 3e-06 .* --allow_change lr"):
        core(["--out_dir", str(out), "--resume", "--lr", "1e-5"])
    assert core(["--out_dir", str(out), "--resume", "--lr", "1e-5", "--allow_change", "lr"]).lr == 1e-5
    # the saved file is never overwritten silently: a changed configuration keeps the old one beside it
    save_config(out, first)
    assert not (out / "config.1.json").exists()  # the same configuration: nothing to keep
    save_config(out, resumed)
    assert json.loads((out / "config.1.json").read_text())["steps"] == 5
    assert json.loads((out / "config.json").read_text())["steps"] == 8
    assert "the previous one is kept as config.1.json" in capsys.readouterr().out


# Paths and conflicting flags (muarl.py), then eval.py's command line: the same rule, one ConfigError naming the flag

PATHS = {"model": "/nonexistent/model", "sft_data": "/nonexistent.jsonl", "data_dir": "/nonexistent/tau2",
         "user_serve": "/nonexistent/customer"}


@pytest.mark.parametrize("flag", list(PATHS))
def test_a_path_to_nothing_is_one_clear_error(flag):
    with pytest.raises(ConfigError, match=flag):
        validate(core([f"--{flag}", PATHS[flag]]))


def test_llm_user_flags_with_the_scripted_user_conflict():
    with pytest.raises(ConfigError, match="are for --user llm"):
        validate(core(["--domains", "shop", "--user", "scripted", "--user_model", "gpt-4.1"]))
    with pytest.raises(ConfigError, match="are for --user llm"):
        demo(["--user", "scripted", "--user_model", "gpt-4.1"])


EVAL_BAD = {
    # flag: bad values; each must be refused by eval.py's parse (evaluation.flags.parse_args), naming the flag
    "eval_trials": ["0", "-1", "x"], "eval_tasks": ["-1"], "temperature": ["-1", "nan"], "top_p": ["0", "1.5", "nan"],
    "max_turns": ["0"], "max_new_tokens": ["0", "40000"], "max_context": ["10"], "check_outputs": ["2"],
    "tools_in_prompt": ["-1"], "user_max_tokens": ["0"], "user_temperature": ["-1"], "bench": ["bfcl"],
    "user_timeout": ["0", "nan", "-1"], "user_retries": ["-1"], "user_backoff": ["-1", "nan"],
    "domains": ["shoes", "shop,shoes"], "model": ["/nonexistent", "runs/none/final", ""], "data_dir": ["/nonexistent"],
    "agent": ["human"], "engine": ["tpu"], "seed": ["x"], "split": ["dev"], "user_prompt": ["tau3"],
}
EVAL_CASES = [(flag, value) for flag, values in EVAL_BAD.items() for value in values]
CONFLICTS = [(["--agent", "oracle", "--model", "runs/x"], "--model is for --agent local"),
             (["--agent", "openai"], "--agent openai needs --agent_model"),
             (["--agent", "oracle", "--agent_model", "gpt-4.1"], "--agent_model is for --agent openai")]


@pytest.mark.parametrize("flag,value", EVAL_CASES, ids=[f"eval-{f}={v}" for f, v in EVAL_CASES])
def test_eval_bad_value_is_one_clear_error(flag, value):
    base = [] if flag == "model" else ["--agent", "oracle"]  # the oracle needs no model, so only `flag` is wrong
    with pytest.raises(ConfigError, match=flag) as e:
        eval_parse(base + [f"--{flag}={value}"])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("argv,says", CONFLICTS)
def test_eval_conflicting_flags(argv, says):
    with pytest.raises(ConfigError, match=says):
        eval_parse(argv)


def test_eval_defaults():
    assert eval_parse(["--agent", "oracle"]).user_timeout == 30.0  # the oracle's defaults are valid
    a = eval_parse(["--model", "Qwen/Qwen3-8B"])
    # flags shared with muarl.py keep muarl's defaults, but an evaluation's: all tasks, 4 greedy trials, an LLM customer
    assert (a.agent, a.eval_tasks, a.eval_trials, a.temperature, a.user, a.engine) == ("local", 0, 4, 0.0, "llm", "hf")
    assert (a.domains, a.max_turns, a.user_timeout) == (Config.domains, Config.max_turns, Config.user_timeout)
    assert set(SHARED) <= {f.name for f in dataclasses.fields(Config)}  # the shared flags are muarl's, by name


# ---------------------------------------------------------------------------------------------------------------
# The command lines themselves, in subprocesses: config.py's recipe, --help's groups and speed, a bad value's line


def cli(*argv, timeout=60):
    """(the finished process, its wall time in seconds) of `python ARGV` in the repository."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "120"})
    return proc, time.perf_counter() - t0


def help_page(text: str) -> dict:
    """argparse's --help page as {section: {flag: its help text}} (a help on the flag's line or the lines under it)."""
    sections, section, flag = {}, None, None
    for line in text.splitlines():
        if re.fullmatch(r"\S[^:]*:", line) and not line.startswith("usage"):
            section, flag = line[:-1], None
            sections[section] = {}
        elif section is not None and (m := re.match(r"  (?:-h, )?--(\w+)(?: \S+)?(?:\s{2,}(\S.*))?$", line)):
            flag = m.group(1)
            sections[section][flag] = m.group(2) or ""
        elif section is not None and flag is not None and line.startswith(" " * 8) and line.strip():
            sections[section][flag] = (sections[section][flag] + " " + line.strip()).strip()
        elif not line.strip():
            flag = None
    return sections


def said(help_text: str) -> str:
    """A flag's help without the default --help appends to it ('... [30]')."""
    return re.sub(r"\s*\[[^\[\]]*\]$", "", help_text).strip()


def printed(proc) -> tuple[dict, dict]:
    """config.py's output as ({field: value}, {field: the group it is printed under})."""
    values, group, groups = {}, None, {}
    for line in proc.stdout.splitlines():
        if line.startswith("# "):
            group = line[2:].split(":")[0]
            continue
        name, value = re.fullmatch(r"  --(\w+)\s+(.*)", line).groups()
        values[name], groups[name] = ast.literal_eval(value), group
    return values, groups


def test_config_py_prints_the_papers_recipe():
    proc, _ = cli("config.py", "--model", "Qwen/Qwen3-8B")
    assert proc.returncode == 0, proc.stderr
    values, groups = printed(proc)
    assert {k: values[k] for k in ("model", "domains", "user", "sft_epochs", "sft_batch", "sft_lr", "group_size",
                                   "tasks_per_step", "lr", "kl_coef", "max_turns")} == {
        "model": "Qwen/Qwen3-8B", "domains": "retail,airline", "user": "llm", "sft_epochs": 2.0, "sft_batch": 128,
        "sft_lr": 5e-06, "group_size": 8, "tasks_per_step": 32, "lr": 1e-06, "kl_coef": 0.001, "max_turns": 30}
    # every setting, once, under its group's heading
    assert groups == {f.name: f.metadata["group"] for f in dataclasses.fields(Config)}
    assert values["user_api_key"] == ""  # a secret is never printed
    # a flag given is what is printed; a bad one is one line
    proc, _ = cli("config.py", "--lr", "3e-6", "--domains", "shop")
    assert (printed(proc)[0]["lr"], printed(proc)[0]["domains"]) == (3e-6, "shop")
    proc, _ = cli("config.py", "--lr", "abc")
    assert proc.returncode != 0 and proc.stderr.splitlines() == ["config: argument --lr: invalid float value: 'abc'"]


HELPS = [(("muarl.py",), Config, ()), (("-m", "demo"), DemoConfig, ("demo",)),
         (("eval.py",), Config, ("evaluation",))]


@pytest.mark.parametrize("argv,cls,own", HELPS, ids=["muarl", "demo", "eval"])
def test_help_is_fast_grouped_and_every_flag_is_explained(argv, cls, own):
    proc, seconds = cli(*argv, "--help")
    seconds = min([seconds] + [cli(*argv, "--help")[1] for _ in range(2)])  # the best of 3: a busy machine
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    assert seconds < 3.0, f"{' '.join(argv)} --help took {seconds:.1f} s (torch imported before the parse?)"
    page = help_page(proc.stdout)
    assert list(page) == ["options", *(["evaluation"] if "evaluation" in own else []), *GROUPS,
                          *(["demo"] if "demo" in own else [])], list(page)
    assert list(page["options"]) == ["help"]
    fields = [f for f in dataclasses.fields(cls) if argv != ("eval.py",) or f.name in SHARED]
    for group in [*GROUPS, *(["demo"] if "demo" in own else [])]:  # each field in the group its metadata names
        assert set(page[group]) == {f.name for f in fields if f.metadata["group"] == group}, group
    for section, flags in page.items():
        for flag, text in flags.items():
            assert said(text), f"--{flag} ({section}) has no help text"
    if "evaluation" in own:
        assert set(page["evaluation"]) == {"agent", "agent_model", "agent_base_url", "agent_api_key", "bench",
                                           "category", "split", "check_outputs", "out"}


@pytest.mark.parametrize("argv", [("muarl.py",), ("-m", "demo"), ("eval.py",)], ids=["muarl", "demo", "eval"])
def test_help_imports_no_torch(argv):
    proc, _ = cli("-X", "importtime", *argv, "--help")
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert imported and not {m for m in imported if m.split(".")[0] in ("torch", "transformers", "numpy")}


@pytest.mark.parametrize("argv,flag,value,kind", [
    (("muarl.py",), "lr", "abc", "float"), (("muarl.py",), "steps", "5.5", "int"),
    (("-m", "demo"), "lr", "abc", "float"), (("-m", "demo"), "steps", "5.5", "int"),
    (("eval.py",), "temperature", "abc", "float"), (("eval.py",), "eval_trials", "5.5", "int")],
    ids=["muarl-lr", "muarl-steps", "demo-lr", "demo-steps", "eval-temperature", "eval-eval_trials"])
def test_a_bad_value_on_the_command_line_is_one_line_exit_2(argv, flag, value, kind):
    proc, seconds = cli(*argv, f"--{flag}", value)
    name = {"muarl.py": "muarl", "-m": "demo", "eval.py": "eval"}[argv[0]]
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"{name}: config error: argument --{flag}: invalid {kind} value: '{value}'"]
    assert seconds < 10  # answered before any heavy import (--help's own bound is above)

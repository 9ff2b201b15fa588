"""config.validate: every bad value of a numeric or choice flag is one ConfigError naming the flag, before any work.

NaN is the case a plain `x < 0` check lets through (every comparison with NaN is False), so it is in every row.
"""

import json
import re

import pytest

from config import ConfigError, parse_config, save_config, validate
from demo import TINY

BAD = {
    # flag: bad values (NaN everywhere a float is taken)
    "grad_clip": ["-1", "nan"], "kl_coef": ["-0.1", "nan"], "temperature": ["-1", "nan"], "top_p": ["0", "1.5", "nan"],
    "lr": ["0", "-1e-6", "nan"], "clip_low": ["1", "-0.1", "nan"], "clip_high": ["-0.1", "nan"],
    "steps": ["-1"], "eval_tasks": ["-5"], "eval_every": ["-1"], "save_every": ["-1"], "threads": ["-2"],
    "train_threads": ["-1"],
    "sft_epochs": ["-1", "nan"], "sft_lr": ["-1", "nan"], "copy_lr": ["nan"], "weight_decay": ["-0.01", "nan"],
    "turn_bonus": ["-0.5", "nan"], "user_temperature": ["nan"], "lazy_rate": ["1.5", "nan"],
    "tiny_hidden": ["0"], "tiny_layers": ["0"], "tiny_vocab": ["0"], "tiny_intermediate": ["0"], "sft_batch": ["0"],
    "max_turns": ["0"], "max_new_tokens": ["0"], "logprob_chunk": ["0"], "micro_batch_tokens": ["-1"],
    "dtype": ["fp8"], "engine": ["tpu"], "advantage": ["ppo"], "malformed": ["ignore"], "user": ["human"],
    "tasks": ["all"], "group_size": ["1"],
}
CASES = [(flag, value) for flag, values in BAD.items() for value in values]


@pytest.mark.parametrize("flag,value", CASES, ids=[f"{f}={v}" for f, v in CASES])
def test_bad_value_is_one_clear_error(flag, value):
    for preset in ([], ["--model", "tiny"]):  # the tiny preset must not paper over a bad value
        cfg = parse_config(preset + [f"--{flag}={value}"])  # "=": argparse reads "-1" alone as a flag
        with pytest.raises(ConfigError, match=flag):
            validate(cfg)


@pytest.mark.parametrize("preset", [[], ["--model", "tiny"]])
def test_the_defaults_are_valid(preset):
    validate(parse_config(preset))  # the paper's defaults and the CPU preset both pass


# ---------------------------------------------------------------------------------------------------------------
# A config file under the command line; --resume restores the saved configuration (issue 15)


def test_config_file_values_and_command_line_overrides(tmp_path):
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"lr": 3e-6, "steps": 7, "domains": "shop", "eval": False}))
    cfg = parse_config(["--config", str(run), "--steps", "9"])
    assert (cfg.lr, cfg.steps, cfg.domains, cfg.eval) == (3e-6, 9, "shop", False)  # the command line wins
    tiny = parse_config(["--model", "tiny", "--config", str(run)])
    assert tiny.steps == 7 and tiny.copy_warmup == TINY["copy_warmup"]  # the file beats the preset; the preset fills the rest
    yaml = pytest.importorskip("yaml")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"group_size": 4}))
    assert parse_config(["--config", str(tmp_path / "run.yaml")]).group_size == 4


@pytest.mark.parametrize("content,phrase", [({"learning_rate": 1e-6}, "'learning_rate' is not a setting"),
                                            ({"steps": "ten"}, "'steps' is not a setting of type <class 'int'>"),
                                            ("{not json", "Expecting property name"), (None, "No such file")])
def test_a_bad_config_file_is_one_error(tmp_path, content, phrase):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ConfigError, match=re.escape(phrase)):
        parse_config(["--config", str(path)])


def test_resume_restores_the_saved_configuration(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    first = parse_config(["--out_dir", str(out), "--lr", "3e-6", "--group_size", "4", "--steps", "5"])
    save_config(out, first)
    resumed = parse_config(["--out_dir", str(out), "--resume", "--steps", "8"])  # --steps may change
    assert (resumed.lr, resumed.group_size, resumed.steps, resumed.resume) == (3e-6, 4, 8, True)
    assert parse_config(["--out_dir", str(out), "--resume", "--lr", "3e-6"]).lr == 3e-6  # given again, the same
    with pytest.raises(ConfigError, match="--lr 1e-05 differs from the resumed run's 3e-06 .* --allow_change lr"):
        parse_config(["--out_dir", str(out), "--resume", "--lr", "1e-5"])
    assert parse_config(["--out_dir", str(out), "--resume", "--lr", "1e-5", "--allow_change", "lr"]).lr == 1e-5
    # the saved file is never overwritten silently: a changed configuration keeps the old one beside it
    save_config(out, first)
    assert not (out / "config.1.json").exists()  # the same configuration: nothing to keep
    save_config(out, resumed)
    assert json.loads((out / "config.1.json").read_text())["steps"] == 5
    assert json.loads((out / "config.json").read_text())["steps"] == 8
    assert "the previous one is kept as config.1.json" in capsys.readouterr().out


# Paths and conflicting flags (muarl.py), then eval.py's command line: the same rule, one ConfigError naming the flag

PATHS = {"model": "/nonexistent/model", "sft_data": "/nonexistent.jsonl", "data_dir": "/nonexistent/tau2"}


@pytest.mark.parametrize("flag", list(PATHS))
def test_a_path_to_nothing_is_one_clear_error(flag):
    with pytest.raises(ConfigError, match=flag):
        validate(parse_config([f"--{flag}", PATHS[flag]]))


def test_llm_user_flags_with_the_scripted_user_conflict():
    with pytest.raises(ConfigError, match="are for --user llm"):
        validate(parse_config(["--model", "tiny", "--user", "scripted", "--user_model", "gpt-4.1"]))


EVAL_BAD = {
    # flag: bad values; each must be refused by eval.parse_args, naming the flag
    "trials": ["0", "-1", "x"], "tasks": ["-1"], "temperature": ["-1", "nan"], "top_p": ["0", "1.5", "nan"],
    "max_turns": ["0"], "max_new_tokens": ["0", "40000"], "max_context": ["10"], "check_outputs": ["2"],
    "tools_in_prompt": ["-1"], "user_max_tokens": ["0"], "user_temperature": ["-1"], "bench": ["bfcl"], "user_timeout": ["0", "nan", "-1"], "user_retries": ["-1"], "user_backoff": ["-1", "nan"],
    "domain": ["shoes", "shop,shoes"], "model": ["/nonexistent", "runs/none/final", ""], "data_dir": ["/nonexistent"],
    "agent": ["human"], "engine": ["tpu"], "user": ["robot"], "seed": ["x"],
}
EVAL_CASES = [(flag, value) for flag, values in EVAL_BAD.items() for value in values]
CONFLICTS = [(["--agent", "oracle", "--model", "runs/x"], "--model is for --agent local"),
             (["--agent", "openai"], "--agent openai needs --agent_model"),
             (["--agent", "oracle", "--agent_model", "gpt-4.1"], "--agent_model is for --agent openai")]


@pytest.mark.parametrize("flag,value", EVAL_CASES, ids=[f"eval-{f}={v}" for f, v in EVAL_CASES])
def test_eval_bad_value_is_one_clear_error(flag, value):
    import eval as ev

    base = [] if flag == "model" else ["--agent", "oracle"]  # the oracle needs no model, so only `flag` is wrong
    with pytest.raises(ConfigError, match=flag if flag != "max_context" else "max_context") as e:
        ev.parse_args(base + [f"--{flag}={value}"])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("argv,says", CONFLICTS)
def test_eval_conflicting_flags(argv, says):
    import eval as ev

    with pytest.raises(ConfigError, match=says):
        ev.parse_args(argv)


def test_eval_defaults_for_the_oracle_are_valid():
    import eval as ev

    assert ev.parse_args(["--agent", "oracle"]).user_timeout == 30.0

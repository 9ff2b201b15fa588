"""config.validate: every bad value of a numeric or choice flag is one ConfigError naming the flag, before any work.

NaN is the case a plain `x < 0` check lets through (every comparison with NaN is False), so it is in every row.
"""

import pytest

from config import ConfigError, parse_config, validate

BAD = {
    # flag: bad values (NaN everywhere a float is taken)
    "grad_clip": ["-1", "nan"], "kl_coef": ["-0.1", "nan"], "temperature": ["-1", "nan"], "top_p": ["0", "1.5", "nan"],
    "lr": ["0", "-1e-6", "nan"], "clip_low": ["1", "-0.1", "nan"], "clip_high": ["-0.1", "nan"],
    "steps": ["-1"], "eval_tasks": ["-5"], "eval_every": ["-1"], "save_every": ["-1"], "threads": ["-2"],
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

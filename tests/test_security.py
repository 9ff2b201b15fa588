"""Secrets and the user's files: what a run writes, logs and sends, and what a failed run leaves behind.

- An API key is never persisted or logged: a run with a canary key leaves it in no file of its folder (config.json,
  log.jsonl, episodes, checkpoints, TensorBoard), and neither `python config.py` nor an error message prints it.
- A key from the environment goes only to the host it belongs to ($OPENAI_API_KEY to $OPENAI_BASE_URL, else to
  OpenAI's own endpoint); plain http off this machine is refused unless --allow_insecure_http.
- A run that stops on bad input (a flag, missing data, an unreachable endpoint) sets nothing aside and writes
  nothing into its output folder.
(Checkpoints from elsewhere: tests/test_checkpoint.py; a start that fails after setting the earlier run
aside: tests/test_first_start.py; the served customer's key: tests/test_serve.py; the checkout left unchanged by
the whole suite: conftest.py's session fixture.)"""

import json
import os
import subprocess
import sys

import pytest

from config import Config
from demo import train as demo_train
from fake_openai import FakeServer
from plumbing.flags import ConfigError, parse_config, public, save_config
from plumbing.preflight import OPENAI_URL, endpoint
from test_muarl import ONE_THREAD, REPO, TINY, new_run, run_demo, tiny_init  # noqa: F401 (a fixture)
from user_sim import make_user

CANARY = "sk-canary-0123456789abcdef-do-not-log"
ENV_CANARY = "sk-env-canary-fedcba9876543210"


def files_holding(folder, secret: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


# ---------------------------------------------------------------------------------------------------------------
# Never persisted, never logged, never printed


def test_a_canary_key_is_in_no_file_of_the_run(tmp_path, tiny_init, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", ENV_CANARY)  # (not for this loopback URL: it must not be sent either)
    out = new_run(tmp_path, tiny_init, "run")
    logger = ["--logger", "tensorboard"] if __import__("importlib").util.find_spec("tensorboard") else []
    with FakeServer(reply="Thanks, that's all. ###STOP###") as srv:
        demo_train.main(TINY + ["--out_dir", str(out), "--steps", "1", "--save_every", "1", "--user", "llm",
                           "--user_model", "tiny", "--user_base_url", srv.url, "--user_api_key", CANARY] + logger)
    assert set(srv.keys) == {f"Bearer {CANARY}"}  # the key was used: the run had it to leak
    assert (out / "config.json").is_file() and (out / "log.jsonl").is_file()
    assert files_holding(out, CANARY) == [] and files_holding(out, ENV_CANARY) == []
    assert json.loads((out / "config.json").read_text())["user_api_key"] == ""
    # resuming takes the key from the command line again, never from disk
    for cfg in (demo_train.parse(["--out_dir", str(out), "--resume", "--user_api_key", CANARY]),
                parse_config(["--out_dir", str(out), "--resume", "--user_api_key", CANARY], Config)):
        assert cfg.user_api_key == CANARY and CANARY not in repr(cfg)
        assert (cfg.user, cfg.user_base_url, cfg.domains) == ("llm", srv.url, "shop")  # the rest: the saved run's


def test_config_prints_and_errors_never_show_a_key(tmp_path):
    r = subprocess.run([sys.executable, "config.py", "--user", "llm", "--user_api_key", CANARY], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "user_api_key" in r.stdout and CANARY not in r.stdout + r.stderr
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps({"user_api_key": 12345678987654321}))  # a key of the wrong type in a --config file
    with pytest.raises(ConfigError) as e:
        parse_config(["--config", str(bad)], Config)
    assert "12345678987654321" not in str(e.value)
    cfg = parse_config(["--user", "llm", "--user_api_key", CANARY], Config)
    save_config(tmp_path, cfg)
    assert CANARY not in (tmp_path / "config.json").read_text() and CANARY not in json.dumps(public(cfg))
    for url in ("http://10.1.2.3:8000/v1", "ftp://x", "https://stranger.example/v1"):  # refusals name no key
        with pytest.raises(ValueError) as e:
            endpoint(url, CANARY if url.startswith("http:") else None, env={"OPENAI_API_KEY": ENV_CANARY})
        assert CANARY not in str(e.value) and ENV_CANARY not in str(e.value)


# ---------------------------------------------------------------------------------------------------------------
# A key goes only to its own host; no plain http off this machine


def test_the_environment_key_goes_only_to_the_host_it_belongs_to():
    env = {"OPENAI_API_KEY": ENV_CANARY}
    assert endpoint(None, None, env=env) == (OPENAI_URL, ENV_CANARY)  # OpenAI's own endpoint: its key
    assert endpoint(OPENAI_URL + "/", None, env=env) == (OPENAI_URL, ENV_CANARY)
    assert endpoint("http://127.0.0.1:8000/v1", None, env=env) == ("http://127.0.0.1:8000/v1", "EMPTY")
    with pytest.raises(ValueError, match="needs an API key.*sent only to https://api.openai.com/v1"):
        endpoint("https://stranger.example/v1", None, env=env)  # someone else's server: never the user's key
    with pytest.raises(ValueError, match="needs an API key"):
        endpoint("https://api.openai.com.stranger.example/v1", None, env=env)  # a look-alike host
    paired = {**env, "OPENAI_BASE_URL": "https://llm.mine.example/v1"}  # the environment pairs key and URL
    assert endpoint(None, None, env=paired) == ("https://llm.mine.example/v1", ENV_CANARY)
    assert endpoint("https://llm.mine.example/v1", None, env=paired)[1] == ENV_CANARY
    with pytest.raises(ValueError, match="sent only to https://llm.mine.example/v1"):
        endpoint(OPENAI_URL, None, env=paired)
    assert endpoint("https://stranger.example/v1", "its-own-key", env=env)[1] == "its-own-key"  # given with the URL


def test_plain_http_off_this_machine_is_refused_unless_allowed():
    for url in ("http://10.0.0.5:8000/v1", "http://llm.example.com/v1"):
        with pytest.raises(ValueError, match="plain http.*--allow_insecure_http"):
            endpoint(url, "k", env={})
        assert endpoint(url, "k", allow_http=True, env={}) == (url, "k")
    for url in ("http://127.0.0.1:8000/v1", "http://localhost:8000/v1", "http://[::1]:8000/v1"):
        assert endpoint(url, None, env={})[1] == "EMPTY"


def test_a_loopback_customer_never_receives_the_environment_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", ENV_CANARY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with FakeServer(reply="hi") as srv:
        make_user("llm", model="tiny", base_url=srv.url, max_retries=0).complete([{"role": "user", "content": "x"}])
    assert srv.keys == ["Bearer EMPTY"]


# ---------------------------------------------------------------------------------------------------------------
# A run that stops on bad input sets nothing aside and writes nothing


def earlier_run(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints" / "step-000003").mkdir(parents=True)
    (out / "log.jsonl").write_text('{"phase": "grpo", "step": 0}\n')
    (out / "results.md").write_text("| model | pass^1 |\n")
    return out, sorted((p.relative_to(out), p.stat().st_size) for p in out.rglob("*"))


@pytest.mark.parametrize("why,args,says", [
    ("a bad flag", ["--group_size", "1"], "group_size must be >= 2"),
    ("missing data", ["--domains", "acebench_agent"], "ACEBench Agent data not found"),  # ($ACEBENCH_DIR: nowhere)
    ("an unreachable endpoint", ["--user", "llm", "--user_model", "m", "--user_base_url", "http://127.0.0.1:9/v1"],
     "unreachable"),
    ("plain http off the machine", ["--user", "llm", "--user_model", "m", "--user_base_url",
                                    "http://10.0.0.5:8000/v1", "--user_api_key", CANARY], "plain http"),
])
def test_a_run_stopped_on_bad_input_sets_nothing_aside(tmp_path, why, args, says):
    out, before = earlier_run(tmp_path)
    env = {**os.environ, **ONE_THREAD, "ACEBENCH_DIR": str(tmp_path / "nowhere")}
    r = run_demo(["--model", "tiny", "--domains", "shop", "--out_dir", str(out)] + args, timeout=300, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and says in r.stderr, (why, r.stderr[-2000:])
    assert CANARY not in r.stderr + r.stdout
    assert sorted((p.relative_to(out), p.stat().st_size) for p in out.rglob("*")) == before, why
    assert not (out / "previous-1").exists()


def test_a_run_into_a_new_folder_that_stops_creates_nothing(tmp_path):
    r = run_demo(["--model", "tiny", "--domains", "shop", "--user", "llm", "--user_model", "m", "--user_base_url",
                  "http://127.0.0.1:9/v1", "--out_dir", str(tmp_path / "new")], timeout=300)
    assert r.returncode == 2 and not (tmp_path / "new").exists(), r.stderr[-2000:]

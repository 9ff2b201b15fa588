"""A core run that fails before its cold start leaves its output folder exactly as it found it.

`python muarl.py --model FOLDER ...` checks its inputs, then sets an earlier run in out_dir aside (previous-<k>/),
opens its log, saves its config.json and loads the model. A failure anywhere before the cold start (a customer
endpoint that cannot be reached, a hub id that cannot be fetched) is one line on stderr and exit status 2, and
out_dir is as it was: the earlier run where it was, no previous-<k>/ folder, no config.json or log of the failed
run; a folder that did not exist is not created. (A bad flag, in tests/test_muarl.py, is refused before any of it.)
"""

import hashlib
import os
import socket

import pytest

from test_muarl import ONE_THREAD, assert_one_line, run_core


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


def tree(folder) -> dict:
    """Every path under `folder`: (size, sha256, mtime) for a file, "folder" for a folder."""
    return {str(p.relative_to(folder)): "folder" if p.is_dir() else
            (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A tiny model folder (config, weights, tokenizer with its chat template): what --model FOLDER names."""
    from demo.tiny_model import build_tiny

    folder = tmp_path_factory.mktemp("model") / "tiny"
    build_tiny(folder, texts=["hello world, the order #W1234567 is pending"] * 20, hidden=32, layers=1, heads=2,
               kv_heads=1, intermediate=64, max_positions=256)
    return folder


def earlier_run(out):
    """out_dir as an earlier, finished run left it, with a file of the user's own beside it."""
    (out / "checkpoints" / "step-000003").mkdir(parents=True)
    for name in ("model.pt", "optim.pt", "state.json", "manifest.json"):
        (out / "checkpoints" / "step-000003" / name).write_text(f"{name} of step 3\n")
    (out / "final").mkdir()
    (out / "final" / "model.safetensors").write_bytes(b"weights")
    files = {"config.json": '{"steps": 3, "lr": 0.001}', "log.jsonl": '{"phase": "grpo", "step": 2}\n',
             "latest.json": '{"step": 3, "path": "step-000003"}', "results.md": "| model | pass^1 |\n",
             "episodes-rank0.jsonl": "{}\n", "samples.txt": "=== step 0\n", "notes.txt": "the user's own\n"}
    for name, text in files.items():
        (out / name).write_text(text)
    return tree(out)


def core_run(model: str, out, *extra: str, env=None):
    return run_core(["--model", model, "--domains", "shop", "--user", "scripted", "--sft_epochs", "0",
                     "--threads", "1", *extra, "--out_dir", str(out)], timeout=600, env=env)


def offline(tmp_path) -> dict:
    # no network, an empty hub cache: a hub id cannot be fetched, whatever the machine's cache holds
    return {**os.environ, **ONE_THREAD, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}


def test_an_unreachable_customer_leaves_the_earlier_run_where_it_was(tmp_path, model_folder):
    out = tmp_path / "run"
    out.mkdir()
    before = earlier_run(out)
    r = core_run(str(model_folder), out, "--user", "llm", "--user_model", "m", "--user_base_url",
                 f"http://127.0.0.1:{closed_port()}/v1")
    assert_one_line(r, "is unreachable")
    assert "is kept in" not in r.stdout  # checked before anything is set aside or written
    assert tree(out) == before and not (out / "previous-1").exists()


@pytest.mark.parametrize("where", ["earlier run", "empty folder", "no folder"])
def test_an_unfetchable_hub_id_leaves_the_folder_as_it_was(tmp_path, where):
    # the model is fetched after the earlier run is set aside, the log opened and config.json saved: all undone
    out = tmp_path / "run"
    if where != "no folder":
        out.mkdir()
    before = earlier_run(out) if where == "earlier run" else {}
    r = core_run("no-such-owner/no-such-model", out, env=offline(tmp_path))
    assert_one_line(r, "--model no-such-owner/no-such-model: cannot fetch it from the Hugging Face hub")
    assert "pass the local folder: --model DIR" in r.stderr
    # (the earlier run really was set aside, then put back)
    assert (f"the earlier run in {out} is kept in {out / 'previous-1'}" in r.stdout) == (where == "earlier run")
    if where == "no folder":
        assert not out.exists()
    else:  # nothing left of the failed start: no previous-1/, no log, no config.json of its own
        assert tree(out) == before


# ---------------------------------------------------------------------------------------------------------------
# Every flag that names a file is read before anything costly: a bad one is one line, exit 2, and out_dir (fresh
# or an earlier run's) is as it was. Before, an empty --sft_data was refused after the model loaded and the
# untrained model was evaluated, leaving config.json, log.jsonl and an episodes file in a fresh out_dir; a JSONL
# line without "messages" was a KeyError traceback.

def bad_files(tmp_path) -> dict:
    """flag -> (a value naming something that exists but is wrong, a phrase its one line must hold)."""
    d = tmp_path / "inputs"
    d.mkdir()
    files = {"empty.jsonl": "", "blank.jsonl": "\n\n", "notjson.jsonl": '{"messages": [\n',
             "nomessages.jsonl": '{"conversation": []}\n', "noagent.jsonl": '{"messages": [{"role": "user", '
             '"content": "hi"}]}\n', "config.json": "{", "afile": "not a folder", "binary.jsonl": b"\xff\xfe\x00"}
    for name, text in files.items():
        (d / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    (d / "nodata").mkdir()
    (d / "noconfig").mkdir()
    return {
        "sft_data empty": (["--sft_data", str(d / "empty.jsonl")], "no conversations in it"),
        "sft_data blank": (["--sft_data", str(d / "blank.jsonl")], "no conversations in it"),
        "sft_data not json": (["--sft_data", str(d / "notjson.jsonl")], "notjson.jsonl:1: not JSON"),
        "sft_data no messages": (["--sft_data", str(d / "nomessages.jsonl")], 'a "messages" list'),
        "sft_data no agent turn": (["--sft_data", str(d / "noagent.jsonl")], "no assistant turn"),
        "sft_data a folder": (["--sft_data", str(d)], "a folder, not a JSONL file"),
        "sft_data binary": (["--sft_data", str(d / "binary.jsonl")], "cannot be read as text"),
        "config unparseable": (["--config", str(d / "config.json")], "--config"),
        "data_dir without the data": (["--data_dir", str(d / "nodata"), "--domains", "retail", "--user", "llm",
                                       "--user_model", "m", "--user_base_url", "http://127.0.0.1:9/v1"],
                                      "no tau2 'retail' data"),
        "user_serve without a model": (["--user", "llm", "--user_serve", str(d / "noconfig")], "no config.json"),
        "model without a config": (["--model", str(d / "noconfig")], "holds no config.json"),
        "out_dir a file": (["--out_dir", str(d / "afile")], "a file stands there"),
        "micro_batch_tokens below a turn": (["--micro_batch_tokens", "1"], "cannot hold one turn"),
    }


FLAGS = ["sft_data empty", "sft_data blank", "sft_data not json", "sft_data no messages", "sft_data no agent turn",
         "sft_data a folder", "sft_data binary", "config unparseable", "data_dir without the data",
         "user_serve without a model", "model without a config", "out_dir a file", "micro_batch_tokens below a turn"]


@pytest.mark.parametrize("case", FLAGS)
@pytest.mark.parametrize("where", ["fresh", "earlier run"])
def test_a_bad_file_flag_is_one_line_before_any_work_and_the_folder_is_as_found(tmp_path, model_folder, capfd,
                                                                              case, where):
    from test_muarl import core_in_process

    args, says = bad_files(tmp_path)[case]
    out = tmp_path / "run"
    if where == "earlier run":
        out.mkdir()
        before = earlier_run(out)
    argv = ["--model", str(model_folder), "--domains", "shop", "--user", "scripted", "--sft_epochs", "1",
            "--threads", "1", "--out_dir", str(out), *args]
    r = core_in_process(argv, capfd)
    assert r.rc == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], r.stderr[-2000:]
    assert "[eval]" not in r.stdout and "Loading weights" not in r.stdout + r.stderr  # nothing costly ran
    if case != "out_dir a file":
        assert tree(out) == before if where == "earlier run" else not out.exists()


def test_a_row_below_the_longest_conversation_is_explained_once(tmp_path, model_folder, capfd):
    from test_muarl import core_in_process

    r = core_in_process(["--model", str(model_folder), "--domains", "shop", "--user", "scripted", "--sft_epochs",
                         "0", "--threads", "1", "--steps", "0", "--eval", "false", "--max_context", "512",
                         "--max_new_tokens", "16", "--micro_batch_tokens", "100", "--out_dir", str(tmp_path / "r")],
                        capfd)
    assert r.rc == 0, r.stderr[-2000:]
    said = [line for line in r.stdout.splitlines() if "--micro_batch_tokens" in line]
    assert said == ["note: --micro_batch_tokens 100 is below --max_context 512: an episode longer than 100 tokens "
                    "is trained in a row of its own (counted as long_rows in log.jsonl)"]

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
    from plumbing.tiny_model import build_tiny

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

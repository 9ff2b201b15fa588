"""Checkpoints you can trust: a manifest of checksums, verified on --resume.

A damaged checkpoint (truncated, one flipped byte, a missing file) is named and passed over for the one before it
(never a traceback naming no file, never a silent resume: one flipped byte took the KL from 0.005 to 3.4); with none
usable the run stops with one line saying what to do; a missing latest.json loses nothing (no restart from step 0
into the same log); a new run never appends to an old run's logs or overwrites its checkpoints, and one that stops
before its cold start puts the old run back; a step re-run after a resume is logged once."""

import json
import os

import pytest
import torch

from demo import train as demo_train
from muarl import TaskSampler
from plumbing.checkpoint import (damage, load_checkpoint, newest_checkpoint, read_latest, resume_point, save_checkpoint,
                                 set_aside, undo_start)
from test_muarl import TINY, grpo_records, new_run, run_demo, tiny_init  # noqa: F401 (a fixture)


def model_at(step):  # weights that say which step they belong to
    m = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(float(step))
    return m


def saved_run(tmp_path, steps=(1, 2)):
    """A run folder with a checkpoint at each step of `steps` and one log line per step before it."""
    out = tmp_path / "run"
    out.mkdir()
    for step in steps:
        with open(out / "log.jsonl", "a") as f:
            f.write(json.dumps({"phase": "grpo", "step": step - 1}) + "\n")
        m = model_at(step)
        save_checkpoint(out, step, m, torch.optim.AdamW(m.parameters()), TaskSampler(list(range(9)), 0),
                        {"results": {}}, 1, 0)
    return out


def resume(out, path=None):
    m = model_at(0)
    step, _ = load_checkpoint(out, m, torch.optim.AdamW(m.parameters()), TaskSampler(list(range(9)), 0), 1, path)
    return step, m.weight[0, 0].item()


def flip_byte(path, offset=None):
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if offset is None else offset] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated": (lambda f: f.write_bytes(f.read_bytes()[:-100]), "truncated"),
    "bit-flipped": (flip_byte, "sha256"),
    "missing": (lambda f: f.unlink(), "missing"),
}


@pytest.mark.parametrize("name", ["model.pt", "optim.pt", "state.json", "manifest.json"])
@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_checkpoint_is_named_and_the_one_before_it_is_used(tmp_path, capsys, name, how):
    out = saved_run(tmp_path)
    hurt, says = DAMAGE[how]
    hurt(out / "checkpoints" / "step-000002" / name)
    assert resume(out) == (1, 1.0)  # the step-1 weights, not the damaged step 2
    err = capsys.readouterr().err
    assert "step-000002" in err and (name in err or "manifest" in err) and (says in err or "manifest" in err)


def test_a_missing_latest_json_loses_nothing(tmp_path):
    out = saved_run(tmp_path)
    (out / "latest.json").unlink()
    assert resume(out) == (2, 2.0)  # the newest complete checkpoint, found without it


def test_no_usable_checkpoint_is_one_line_saying_what_to_do(tmp_path):
    out = saved_run(tmp_path)
    for step in (1, 2):
        flip_byte(out / "checkpoints" / f"step-00000{step}" / "model.pt")
    with pytest.raises(ValueError, match="--resume false") as e:
        resume(out)
    assert "\n" not in str(e.value) and "step-000002: model.pt" in str(e.value)


def test_a_resume_cuts_the_logs_back_to_its_step(tmp_path):
    out = saved_run(tmp_path)  # log: steps 0, 1; checkpoint at 2
    with open(out / "log.jsonl", "a") as f:  # step 2 ran and was logged, then the run died before its checkpoint
        f.write(json.dumps({"phase": "grpo", "step": 2}) + "\n")
    assert resume(out)[0] == 2
    assert [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()] == [0, 1]


def test_the_same_step_saved_again_is_trusted_at_every_point(tmp_path):
    out = saved_run(tmp_path, steps=(1,))
    path = out / "checkpoints" / "step-000001"
    before = json.loads((path / "manifest.json").read_text())
    m = model_at(1)
    save_checkpoint(out, 1, m, torch.optim.AdamW(m.parameters()), TaskSampler(list(range(9)), 0),
                    {"results": {"final": 1}}, 1, 0)
    assert damage(path) is None and json.loads((path / "manifest.json").read_text()) != before


# latest.json is a hint: whatever it holds, a resume takes the newest intact checkpoint, says so in one line,
# and leaves a pointer the next resume reads; stale .tmp leftovers of a killed save never block a save.
POINTERS = {
    "cut short": (lambda out: (out / "latest.json").write_text("{"), "not a checkpoint pointer"),
    "empty": (lambda out: (out / "latest.json").write_text(""), "is empty"),
    "not json of a pointer": (lambda out: (out / "latest.json").write_text("[1, 2]"), "not a checkpoint pointer"),
    "a path out of the run": (lambda out: (out / "latest.json").write_text('{"path": "../../etc"}'),
                              "not a checkpoint folder"),
    "a folder that is gone": (lambda out: (out / "latest.json").write_text('{"step": 6, "path": "step-000006"}'),
                              "step-000006, which is gone"),
    "a damaged folder": (lambda out: flip_byte(out / "checkpoints" / "step-000002" / "model.pt"), "damaged"),
    "a binary file": (lambda out: (out / "latest.json").write_bytes(b"\xff\xfe\x00"), "cannot be read"),
}


def save_at(out, step):
    m = model_at(step)
    save_checkpoint(out, step, m, torch.optim.AdamW(m.parameters()), TaskSampler(list(range(9)), 0),
                    {"results": {}}, 1, 0)


@pytest.mark.parametrize("case", list(POINTERS))
def test_a_damaged_pointer_is_named_passed_over_and_mended_resuming_twice(tmp_path, capsys, case):
    out = saved_run(tmp_path)
    hurt, says = POINTERS[case]
    hurt(out)
    # a killed save's leftovers, folder and file alike, stand where the next saves write
    (out / "checkpoints" / "step-000003.tmp").mkdir()
    (out / "checkpoints" / "step-000003.tmp" / "model.pt").write_bytes(b"half")
    (out / "latest.json.tmp").mkdir()
    want = 1 if case == "a damaged folder" else 2
    found = resume_point(out)  # the first resume: one line, what it found and what it takes instead
    err = capsys.readouterr().err.strip().splitlines()
    assert found.name == f"step-00000{want}" and len(err) == 1 and says in err[0], err
    assert f"resuming from {found}" in err[0]
    assert read_latest(out) == (found.name, None)  # mended at once: a crash now still leaves a whole pointer
    assert resume(out, found) == (want, float(want))
    save_at(out, 3)  # the run goes on and saves through the leftovers
    save_at(out, 3)  # ... and again at the same step, as a run's end does after its final evaluation
    assert damage(out / "checkpoints" / "step-000003") is None
    assert not list((out / "checkpoints").glob("*.tmp")) and not (out / "latest.json.tmp").exists()
    found = resume_point(out)  # the second resume: the pointer is whole, nothing to say
    assert found.name == "step-000003" and capsys.readouterr().err == "" and resume(out, found) == (3, 3.0)


def test_a_pointer_older_than_a_whole_checkpoint_is_named_and_the_newer_one_taken(tmp_path, capsys):
    out = saved_run(tmp_path)  # killed between the rename of step 2 and the pointer's replacement
    (out / "latest.json").write_text('{"step": 1, "path": "step-000001"}')
    assert resume_point(out).name == "step-000002" and "older than the intact step-000002" in capsys.readouterr().err
    assert read_latest(out) == ("step-000002", None)


def test_a_whole_pointer_or_none_is_resumed_without_a_word(tmp_path, capsys):
    out = saved_run(tmp_path)
    assert resume_point(out).name == "step-000002"
    (out / "latest.json").unlink()
    assert resume_point(out).name == "step-000002" and capsys.readouterr().err == ""
    assert not (out / "latest.json").exists()  # no pointer is no disagreement: nothing written


def test_a_new_run_sets_an_old_one_aside(tmp_path):
    out = saved_run(tmp_path)
    (out / "tiny-init").mkdir()
    aside = set_aside(out)
    assert aside == out / "previous-1" and (aside / "checkpoints" / "step-000002").is_dir()
    assert (aside / "log.jsonl").is_file() and not (out / "log.jsonl").exists()
    assert (out / "tiny-init").is_dir()  # the tiny model is not a run's record: reused as before
    assert newest_checkpoint(out) is None and set_aside(out) is None


def tree(folder) -> dict:
    """Every path under `folder`: (size, sha256, mtime) for a file, "folder" for a folder."""
    import hashlib

    return {str(p.relative_to(folder)): "folder" if p.is_dir() else
            (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def test_a_start_that_fails_puts_the_old_run_back(tmp_path):
    # what a run does before its cold start, undone: the earlier run set aside, new files written, then a failure
    out = saved_run(tmp_path)
    (out / "tiny-init").mkdir()
    (out / "tiny-init" / "config.json").write_text("{}")
    (out / "config.json").write_text('{"steps": 2}')
    (out / "notes.txt").write_text("the user's own\n")  # no file of a run: never moved
    found, before = tree(out), {p.name for p in out.iterdir()}
    aside = set_aside(out)
    assert aside == out / "previous-1" and not (out / "config.json").exists()
    (out / "log.jsonl").write_text('{"phase": "data"}\n')  # the new run's log, config, episodes, a folder
    (out / "config.json").write_text('{"steps": 5}')
    (out / "episodes-rank0.jsonl").write_text("")
    (out / "cold-start.tmp").mkdir()
    (out / "cold-start.tmp" / "x").write_text("x")
    undo_start(out, before, aside)
    assert tree(out) == found  # the same files, bytes and times: moved back, not copied
    # a folder that was empty stays, empty; one that did not exist is gone again
    for folder, was in ((tmp_path / "empty", set()), (tmp_path / "new", None)):
        folder.mkdir()
        (folder / "log.jsonl").write_text("")
        undo_start(folder, was, None)
        assert (folder.exists() and not any(folder.iterdir())) if was is not None else not folder.exists()


# ---------------------------------------------------------------------------------------------------------------
# The entry point: a flipped byte, a missing latest.json, a run started over, each step logged once


def test_cli_resume_after_damage_logs_each_step_once(tmp_path, tiny_init):
    out = new_run(tmp_path, tiny_init, "run")
    args = TINY + ["--out_dir", str(out), "--save_every", "1", "--eval_tasks", "0"]
    demo_train.main(args + ["--steps", "2"])
    flip_byte(out / "checkpoints" / "step-000002" / "model.pt")  # (resumed silently, this took the KL 0.005 -> 3.4)
    (out / "latest.json").unlink()
    demo_train.main(args + ["--steps", "3", "--resume"])  # from step 1: steps 1 and 2 run again
    assert [s["step"] for s in grpo_records(out)] == [0, 1, 2]  # each once
    # a new run in the same folder: the old one is kept whole, the new log starts empty
    demo_train.main(args + ["--steps", "1"])
    assert [s["step"] for s in grpo_records(out)] == [0]
    assert [s["step"] for s in grpo_records(out / "previous-1")] == [0, 1, 2]
    assert (out / "previous-1" / "checkpoints" / "step-000003").is_dir()


@pytest.mark.parametrize("case", ["cut short", "a folder that is gone"])
def test_cli_a_damaged_pointer_never_makes_a_run_unfinishable(tmp_path, tiny_init, capfd, case):
    # Before: a run resumed past `{` or a pointer to a deleted folder trained its step, then died saving it, and so
    # did every later resume. Now: one line, the run finishes, and the next resume reads the pointer it left.
    out = new_run(tmp_path, tiny_init, "run")
    args = TINY + ["--out_dir", str(out), "--save_every", "1", "--eval_tasks", "0"]
    demo_train.main(args + ["--steps", "2"])
    POINTERS[case][0](out)
    (out / "checkpoints" / "step-000003.tmp").mkdir()  # a killed save's leftover, where the next save writes
    capfd.readouterr()
    demo_train.main(args + ["--steps", "3", "--resume"])
    said = [line for line in capfd.readouterr().err.splitlines() if "latest.json" in line]
    assert len(said) == 1 and "resuming from" in said[0] and "step-000002" in said[0], said
    assert json.loads((out / "latest.json").read_text())["path"] == "step-000003"
    demo_train.main(args + ["--steps", "4", "--resume"])  # the second resume: nothing to say
    assert "latest.json" not in capfd.readouterr().err
    assert [s["step"] for s in grpo_records(out)] == [0, 1, 2, 3]  # each step once
    assert damage(out / "checkpoints" / "step-000004") is None and not list((out / "checkpoints").glob("*.tmp"))


def test_cli_no_usable_checkpoint_is_one_line_and_exit_2(tmp_path):
    out = saved_run(tmp_path, steps=(1,))
    (out / "checkpoints" / "step-000001" / "optim.pt").unlink()
    # the scripted customer: the refusal is the checkpoint's, whether or not vLLM (the served customer) is installed
    r = run_demo(["--model", "tiny", "--user", "scripted", "--out_dir", str(out), "--resume"], timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith("demo: no usable checkpoint")
    assert (out / "log.jsonl").read_text().count("\n") == 1  # nothing started, nothing written


# ---------------------------------------------------------------------------------------------------------------
# A checkpoint from elsewhere: loading it runs nothing, and its manifest reaches nothing outside the run


class Boom:
    """Unpickling this calls os.system: what a planted checkpoint file would carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def replant(ck, **manifest):
    """Recompute ck's manifest over the files now there (what anyone can do: it detects damage, not intent)."""
    from plumbing.checkpoint import _manifest, _sha256

    body = json.loads((ck / "manifest.json").read_text())
    body.pop("check")
    names = [p.name for p in ck.iterdir() if p.name != "manifest.json"]
    body["files"] = {n: [[(ck / n).stat().st_size, _sha256(ck / n)]] for n in names}
    (ck / "manifest.json").write_text(_manifest({**body, **manifest}))


@pytest.mark.parametrize("name", ["model.pt", "optim.pt", "state.pt"])
def test_a_planted_pickle_runs_nothing_on_resume(tmp_path, capsys, name):
    out, marker = saved_run(tmp_path), tmp_path / "pwned"
    ck = out / "checkpoints" / "step-000002"
    torch.save({"state": {}, "param_groups": [], "x": Boom(marker)}, ck / name)
    replant(ck)
    assert damage(out / "checkpoints" / "step-000001") is None
    if name == "state.pt":  # a pickled state beside the JSON one: refused whole, the step before it used
        assert resume(out) == (1, 1.0) and "'state.pt', no file of a run" in capsys.readouterr().err
    else:  # its checksums match: loading it is refused (one line), before anything in it runs
        with pytest.raises(ValueError, match="holds more than tensors") as e:
            resume(out)
        assert "\n" not in str(e.value)
    assert not marker.exists()


def test_a_pickled_checkpoint_is_one_line_at_the_cli(tmp_path):
    out, marker = saved_run(tmp_path, steps=(1,)), tmp_path / "pwned"
    ck = out / "checkpoints" / "step-000001"
    torch.save(Boom(marker), ck / "optim.pt")
    replant(ck)
    # the scripted customer: the refusal is the checkpoint's, whether or not vLLM (the served customer) is installed
    r = run_demo(["--model", "tiny", "--user", "scripted", "--out_dir", str(out), "--resume"], timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "holds more than tensors" in r.stderr, r.stderr[-2000:]
    assert not marker.exists()


@pytest.mark.parametrize("where", ["../../victim.txt", "ABSOLUTE", "../log.jsonl", "checkpoints/../../victim.txt"])
def test_manifest_names_outside_the_run_touch_nothing(tmp_path, capsys, where):
    out = saved_run(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    name = str(victim) if where == "ABSOLUTE" else where
    ck = out / "checkpoints" / "step-000002"
    logs = json.loads((ck / "manifest.json").read_text())["logs"]
    replant(ck, logs={**logs, name: 0})
    assert "no file of a run" in damage(ck)
    assert resume(out) == (1, 1.0)  # passed over, named, like a damaged one
    assert "step-000002" in capsys.readouterr().err and victim.read_text() == "precious\n"
    with pytest.raises(ValueError, match="outside the run folder"):  # a path handed to load_checkpoint directly
        m = model_at(0)
        load_checkpoint(out, m, torch.optim.AdamW(m.parameters()), TaskSampler(list(range(9)), 0), 1, path=ck)
    assert victim.read_text() == "precious\n"
    # the same for a checkpoint file name: it is hashed, so it could be read from anywhere
    replant(ck)
    body = json.loads((ck / "manifest.json").read_text())
    body.pop("check")
    from plumbing.checkpoint import _manifest

    (ck / "manifest.json").write_text(_manifest({**body, "files": {**body["files"], name: [[9, "0" * 64]]}}))
    assert "no file of a run" in damage(ck)


def test_a_linked_log_is_not_followed_out_of_the_run(tmp_path):
    out = saved_run(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n" * 100)
    (out / "samples.txt").symlink_to(victim)  # a run folder shared with a link where a log was
    ck = out / "checkpoints" / "step-000002"
    replant(ck, logs={"log.jsonl": 1, "samples.txt": 0})
    resume(out)
    assert victim.read_text() == "precious\n" * 100


def test_every_torch_load_in_the_project_states_weights_only_true():
    # A tensor file from anywhere is loaded as tensors and numbers only: no load in the project (benchmarks
    # included) leaves the choice to torch's default.
    import ast
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    loose = []
    for path in sorted(p for p in repo.rglob("*.py") if not {"tests", ".venv", "runs"} & set(p.relative_to(repo).parts)):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
                said = {k.arg: ast.unparse(k.value) for k in node.keywords}
                if said.get("weights_only") != "True":
                    loose.append(f"{path.relative_to(repo)}:{node.lineno}")
    assert not loose, f"torch.load without weights_only=True: {loose}"

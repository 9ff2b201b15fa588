"""Resumable state: atomic checkpoints of the weights, AdamW, the task order's place and the random generators.

Why atomic: a run can die at any instant (SIGKILL, a preempted node), leaving a file written in
place truncated yet named by latest.json. A rename (os.replace) is atomic: a reader finds the old
file or the new, never half. So a checkpoint is written to a temporary folder and renamed, and
`latest.json` is replaced last: a crash loses at most the current step (tests/test_muarl.py kills
runs, and fails each file operation). latest.json is a hint, never a dependency: --resume scans the
checkpoints for the newest intact one, says so in one line when latest.json disagrees (cut short,
empty, naming a folder that is gone or damaged) and rewrites it; a save never reads it as more than a
hint, and a stale `.tmp` left by a killed save is cleared, never in the way.

Why a manifest: a rename guards against a crash, not against a disk. Each checkpoint holds
manifest.json, the size and sha256 of each of its files and the length of every log at that step.
--resume takes the newest checkpoint whose files match it, names each damaged one it passes over,
and cuts the logs back to that step, so a step re-run after the resume is logged once; with
checkpoints but none usable it stops with one line. A new run (not --resume) in a folder holding an
old one first moves the old one into previous-<k>/: nothing is overwritten or appended to.

Why no pickle: the manifest finds damage, not intent (anyone can recompute it), and unpickling can
run any code. So tensors load with `weights_only=True` (model.pt, optim.pt), the rest (step,
sampler, generators, results) is state.json, and a manifest naming a path outside the run folder
(`../x`, `/x`) makes its checkpoint unusable."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from plumbing.fsdp import barrier, decide_on_rank0, full_state_dict, is_sharded
from plumbing.runlog import TOKENS

# --------------------------------------------------------------------------------------------------
# Trust: the manifest's checksums, the newest checkpoint that matches them, an old run set aside

# with episodes-rank*.jsonl: the logs a resume cuts back to its step (view-tokens.jsonl: the page's token
# record, written by plumbing/runlog.py)
RUN_LOGS = ("log.jsonl", "samples.txt", TOKENS)
CHECKPOINT_FILES = ("model.pt", "optim.pt", "state.json")  # what a checkpoint folder holds, beside its manifest
RUN_FILES = RUN_LOGS + ("latest.json", "checkpoints", "config.json", "results.md", "cold-start", "final",
                        "curves.png", "tensorboard", "customer-server.log", "baselines.md", "view.html")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _manifest(body: dict) -> str:  # the manifest's text, carrying its own checksum (so damage to it is named too)
    return json.dumps({**body, "check": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()})


def _log_name(name) -> bool:  # a run log's own plain name, as save_checkpoint writes them: no folder, no ../, no /x
    return isinstance(name, str) and (name in RUN_LOGS or re.fullmatch(r"episodes-rank\d+\.jsonl", name) is not None)


def damage(path: Path) -> str | None:
    """What is wrong with the checkpoint folder `path` (a missing, truncated or altered file, or a
    manifest naming a path outside the run), or None if whole."""
    try:
        body = json.loads((path / "manifest.json").read_text())
        check, files, logs = body.pop("check"), body["files"], body["logs"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "manifest.json is missing or unreadable"
    if json.loads(_manifest(body))["check"] != check:
        return "manifest.json fails its own checksum (damaged on disk)"
    # names are joined to the run folder (logs are cut back on resume): only the names save_checkpoint writes. (An older
    # muarl's state.pt is refused too: a pickle, and loading one can run code.)
    if bad := [n for n in files if n not in CHECKPOINT_FILES] + [n for n in logs if not _log_name(n)]:
        return f"manifest.json names {bad[0]!r}, no file of a run (refused: a pickle, or a path out of the run folder)"
    for name, versions in files.items():
        if not (path / name).is_file():
            return f"{name} is missing"
        if (size := (path / name).stat().st_size) not in [b for b, _ in versions]:
            return f"{name} is truncated or overwritten ({size} bytes, expected {versions[0][0]})"
        if _sha256(path / name) not in [h for _, h in versions]:
            return f"{name} fails its sha256 checksum (damaged on disk)"
    return None


def newest_checkpoint(out: Path, said: str | None = None) -> Path | None:
    """The newest checkpoint in out/checkpoints whose files match its manifest; each newer damaged
    one is named on stderr. None if there is no checkpoint; if there are some but none is usable, a
    ValueError says what to do. latest.json is not needed: a folder is renamed into place only once
    complete, manifest included."""
    folders = sorted((p for p in (out / "checkpoints").glob("step-*") if not p.name.endswith(".tmp")), reverse=True)
    bad = []
    for path in folders:
        if (why := damage(path)) is None:
            return path
        bad.append(f"{path.name}: {why}")
        if path.name != said:  # (`said`: a folder whose damage the caller names itself)
            print(f"checkpoint {path}: {why}; trying the one before it", file=sys.stderr, flush=True)
    if bad:
        raise ValueError(f"no usable checkpoint in {out / 'checkpoints'} ({'; '.join(bad)}): restore the damaged files "
                         "or pass --resume false to start a new run (this one is then kept in previous-<k>/)")
    return None


def read_latest(out: Path) -> tuple[str | None, str | None]:
    """(the checkpoint folder latest.json names, what is wrong with latest.json or None). It may be
    absent, cut short by a disk or an editor, or name a folder that was deleted: it is a hint, and
    the checkpoints themselves are the truth (newest_checkpoint scans them)."""
    path = out / "latest.json"
    if not path.exists():
        return None, None
    try:
        text = path.read_text()
        name = json.loads(text)["path"]
    except (OSError, UnicodeDecodeError) as e:
        return None, f"{path} cannot be read ({getattr(e, 'strerror', None) or 'not text'})"
    except (ValueError, KeyError, TypeError):
        return None, f"{path} is empty" if not text.strip() else f"{path} is not a checkpoint pointer ({text[:40]!r})"
    if not isinstance(name, str) or not re.fullmatch(r"step-\d+", name):
        return None, f"{path} names {name!r}, not a checkpoint folder"
    if not (out / "checkpoints" / name).is_dir():
        return name, f"{path} names checkpoints/{name}, which is gone"
    if (why := damage(out / "checkpoints" / name)) is not None:
        return name, f"{path} names checkpoints/{name}, which is damaged ({why})"
    return name, None


def resume_point(out: Path, rank: int = 0) -> Path | None:
    """The checkpoint --resume continues from: the newest intact one. When latest.json disagrees
    (damaged, empty, naming a folder that is gone or damaged, or an older step than one found whole)
    one line says what it held and which checkpoint is taken instead, and rank 0 rewrites it to
    name that checkpoint, so the next resume reads a whole pointer."""
    named, problem = read_latest(out)
    found = newest_checkpoint(out, said=named if problem else None)
    if found is None or (problem is None and named == found.name) or (named is None and problem is None):
        return found
    why = problem or f"{out / 'latest.json'} names checkpoints/{named}, older than the intact {found.name}"
    print(f"muarl: {why}; resuming from {found} (the newest intact checkpoint)", file=sys.stderr, flush=True)
    if rank == 0:
        _write_atomically(out / "latest.json", json.dumps({"step": int(found.name.split("-")[1]), "path": found.name}))
    return found


def _clear(path: Path) -> None:
    """Remove whatever stands at `path` (a stale temporary file or folder of a run killed while saving)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _write_atomically(path: Path, text: str) -> None:
    """`text` into `path`, written aside and renamed: a reader finds the old file or the new, never half."""
    tmp = path.with_name(path.name + ".tmp")
    _clear(tmp)
    tmp.write_text(text)
    os.replace(tmp, path)


def set_aside(out: Path) -> Path | None:
    """Move an earlier run's files (logs, checkpoints, models) into out/previous-<k>/, so a new run
    in the same folder neither appends to its logs nor overwrites its checkpoints. Returns that
    folder, or None if there was no run."""
    found = [p for p in out.iterdir() if p.name in RUN_FILES or p.match("episodes-rank*.jsonl")] if out.is_dir() else []
    if not found:
        return None
    k = 1 + max([int(p.name.split("-")[1]) for p in out.glob("previous-*") if p.name.split("-")[1].isdigit()] + [0])
    (dest := out / f"previous-{k}").mkdir()
    for p in found:
        os.replace(p, dest / p.name)
    return dest


def undo_start(out: Path, before: set[str] | None, aside: Path | None) -> None:
    """A run that stopped before it trained anything leaves nothing behind: what it wrote in `out`
    goes (the names not in `before`, the folder's entries when it started; None: the folder did not
    exist), and the earlier run it set aside in `aside` comes back where it was."""
    if not out.is_dir():
        return
    for p in out.iterdir():
        if (before is None or p.name not in before) and p != aside:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    if aside is not None and aside.is_dir():
        for p in aside.iterdir():
            os.replace(p, out / p.name)
        aside.rmdir()
    if before is None and not any(out.iterdir()):
        out.rmdir()


# --------------------------------------------------------------------------------------------------
# Checkpoints: written aside, renamed, then latest.json replaced (atomic at every step)


def rng_state() -> dict:
    """Every global random generator's state as JSON lists (a checkpoint keeps it as text, not a
    pickle: loading gives numbers back; muarl also puts it back after vLLM starts, which seeds them
    all)."""
    np_state = np.random.get_state()
    return {"python": random.getstate(), "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
            "torch": torch.get_rng_state().tolist()}


def set_rng_state(rng: dict) -> None:
    random.setstate((rng["python"][0], tuple(rng["python"][1]), rng["python"][2]))  # JSON lists back to the types
    np.random.set_state((rng["numpy"][0], np.array(rng["numpy"][1], dtype=np.uint32), *rng["numpy"][2:]))
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))


def save_checkpoint(out: Path, step: int, policy, opt, sampler, extra: dict, world_size: int, rank: int):
    """Weights, AdamW's moments, the sampler and the generators at `step`. Under FSDP2 every rank
    calls it (the gathers are collectives) and only rank 0 keeps the whole, in host memory, one
    tensor gathered at a time: no GPU ever holds a whole copy."""
    state = full_state_dict(policy, world_size, keep=rank == 0)
    if is_sharded(policy):  # the optimizer state is sharded like the weights: gathered whole onto rank 0's CPU
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        optim = get_optimizer_state_dict(policy, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        optim = opt.state_dict()
    if rank != 0:
        return
    latest, final = out / "latest.json", out / "checkpoints" / f"step-{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    for stale in (out / "checkpoints").glob("*.tmp"):  # a run killed while saving left it: never in the way
        _clear(stale)
    tmp.mkdir()
    resume = {"step": step, "sampler": {"epoch": sampler.epoch, "pos": sampler.pos, "again": sampler.again},
              "rng": rng_state(), **extra}
    torch.save(state, tmp / "model.pt")
    torch.save(optim, tmp / "optim.pt")
    (tmp / "state.json").write_text(json.dumps(resume))
    # [[bytes, sha256], ...] per file: the versions accepted
    files = {name: [[(tmp / name).stat().st_size, _sha256(tmp / name)]] for name in CHECKPOINT_FILES}
    logs = {f.name: f.stat().st_size for f in out.iterdir() if f.name in RUN_LOGS or f.match("episodes-rank*.jsonl")}
    (tmp / "manifest.json").write_text(_manifest({"step": step, "files": files, "logs": logs}))
    if read_latest(out)[0] == final.name and (final / "manifest.json").is_file():
        # the same step again (a run's end adds its final evaluation), named by latest.json: never
        # remove the folder. Its files are replaced one at a time, so the manifest accepts the old
        # and the new version of each until the last one is in (same step, same weights: any mix of
        # the two is the same checkpoint).
        both = json.loads((final / "manifest.json").read_text())["files"] if (final / "manifest.json").exists() else {}
        (tmp / "both.json").write_text(_manifest({"step": step, "logs": logs,
                                                  "files": {k: v + both.get(k, []) for k, v in files.items()}}))
        os.replace(tmp / "both.json", final / "manifest.json")
        for f in [f for f in tmp.iterdir() if f.name != "manifest.json"] + [tmp / "manifest.json"]:
            os.replace(f, final / f.name)  # one file at a time, each atomically; the manifest last
        tmp.rmdir()
    else:
        _clear(final)  # a leftover of a run killed before latest.json pointed to it
        os.replace(tmp, final)
    # the commit point: from here on --resume starts at this step
    _write_atomically(latest, json.dumps({"step": step, "path": final.name}))
    for old in sorted((out / "checkpoints").glob("step-*"))[:-2]:  # keep the last two
        if old.name != final.name and not old.name.endswith(".tmp"):
            shutil.rmtree(old, ignore_errors=True)


def save_pretrained(policy, tokenizer, path: Path, world_size: int, rank: int) -> None:
    """The whole model in Hugging Face format (for vLLM, eval.py, load_policy); `path` is complete
    or absent."""
    # every rank calls save_pretrained (under FSDP the gathers are collectives); rank 0 keeps the whole, on its CPU
    state = full_state_dict(policy, world_size, keep=rank == 0)
    # a gathered dict holds tied weights twice (lm_head.weight beside the embedding): drop the copy, as HF does
    if getattr(policy.config, "tie_word_embeddings", False):
        for tied in getattr(policy, "_tied_weights_keys", None) or {}:
            state.pop(tied, None)
    if rank == 0:
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        policy.save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)  # written aside, then renamed
    barrier(world_size)  # no rank goes on (e.g. to load the folder) before it is written


def load_checkpoint(out: Path, policy, opt, sampler, world_size: int,
                    path: Path | None = None) -> tuple[int, dict]:
    """(step, state) of the newest usable checkpoint (or `path`), or (0, {}), after restoring what a
    run needs to go on as if never stopped: weights, AdamW's moments (zero ones would jolt the
    policy), the sampler's place, every random generator; and the logs, cut back to that step (what
    was logged after it is logged again as the steps re-run)."""
    if (path := path or newest_checkpoint(out)) is None:
        return 0, {}
    # map_location: tensors saved from a GPU would otherwise return to it (cuda:0 on every rank);
    # mmap: read as used. Under FSDP2 rank 0 alone reads the files and broadcasts one tensor at a
    # time; each rank keeps its shard.
    sharded, lead = is_sharded(policy), not is_sharded(policy) or torch.distributed.get_rank() == 0
    # the step, the sampler, the generators and the logs' lengths as rank 0 reads them, on every rank
    state, logs = decide_on_rank0(lambda: (json.loads((path / "state.json").read_text()),
                                           json.loads((path / "manifest.json").read_text())["logs"]), world_size)
    try:  # weights_only: tensors, numbers, strings, lists, dicts; a pickle building anything else (os.system is one
        # __reduce__ away) is refused before it runs
        model_sd, optim_sd = (torch.load(path / f, weights_only=True, map_location="cpu", mmap=True) if lead else {}
                              for f in ("model.pt", "optim.pt"))
    except pickle.UnpicklingError as e:
        raise ValueError(f"checkpoint {path}: a file holds more than tensors and numbers (refused, nothing in it ran: "
                         f"{str(e).splitlines()[0][:120]})") from None
    for name, size in logs.items():
        if not _log_name(name):  # damage() refuses these; checked again here, for a `path` passed in unchecked
            raise ValueError(f"checkpoint {path}: manifest.json names {name!r}, outside the run folder: not resumed")
        log = out / name  # a link is not followed out of the run either
        if log.is_file() and not log.is_symlink() and log.stat().st_size > size:
            os.truncate(log, size)
    if sharded:
        import torch.distributed.checkpoint.state_dict as dcp

        options = dcp.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        dcp.set_model_state_dict(policy, model_sd, options=options)
        dcp.set_optimizer_state_dict(policy, opt, optim_sd, options=options)
    else:
        policy.load_state_dict(model_sd)
        opt.load_state_dict(optim_sd)
    sampler.epoch, sampler.pos, sampler.again = state["sampler"]["epoch"], state["sampler"]["pos"], \
        state["sampler"].get("again", [])
    set_rng_state(state["rng"])
    return state["step"], state


# --------------------------------------------------------------------------------------------------
# Demo: python -m plumbing.checkpoint — a run saved at step 2 and resumed holds the same weights and the
# same place in its tasks

if __name__ == "__main__":
    import tempfile
    from types import SimpleNamespace

    out = Path(tempfile.mkdtemp(prefix="muarl-ckpt-"))
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    # muarl.TaskSampler's place in the task order: epoch 1, position 1, one task handed back
    sampler = SimpleNamespace(epoch=1, pos=1, again=["task-3"])
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()  # now AdamW holds moments worth saving
    save_checkpoint(out, 2, model, opt, sampler, {"note": "demo"}, world_size=1, rank=0)
    print("saved", (out / "latest.json").read_text(), sorted(os.listdir(out / "checkpoints" / "step-000002")))
    model2, sampler2 = torch.nn.Linear(4, 2), SimpleNamespace(epoch=0, pos=0, again=[])  # a fresh process: all new
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    step, state = load_checkpoint(out, model2, opt2, sampler2, world_size=1)
    print(f"resumed at step {step} ({state['note']}): the task order's place {vars(sampler2)}; same weights: "
          f"{all(map(torch.equal, model.parameters(), model2.parameters()))}")

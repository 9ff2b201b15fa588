"""A run's start and end, the parts a reader of muarl.train may skip: resume, checkpoints, provenance, and
leaving a failed start as it was found.

muarl.train builds the run in view and calls these by name:

    resume_point(...)        on --resume, the newest intact checkpoint, as rank 0 finds it
    kept_as_found(...)       an earlier run in the folder set aside; a start that fails inside it leaves the
                             folder as it found it (checkpoint.undo_start)
    record_start(...)        config.json and where the data came from, printed and logged
    restore(...)             on --resume, the weights, AdamW's moments, the task order and the results saved
    save(...)                a checkpoint of the run as it stands
    finish(...)              the final model and the run's record (results.md, final/muarl.json, the page)

Nothing here imports the top level: what it needs is passed in.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from plumbing import checkpoint as ckpt
from plumbing.flags import save_config
from plumbing.fsdp import barrier, decide_on_rank0


def resume_point(resume: bool, out: Path, rank: int, world_size: int) -> Path | None:
    """The checkpoint --resume continues from, the same on every rank (rank 0 reads the folder and mends a
    latest.json that disagrees); None for a fresh run."""
    return decide_on_rank0(lambda: ckpt.resume_point(out, rank) if resume else None, world_size)


@contextmanager
def kept_as_found(out: Path, fresh: bool, rank: int, world_size: int, on_failure):
    """Inside: the run's folder exists and an earlier run in it is kept in previous-<k>/ (never appended to
    nor overwritten). A fresh start that fails inside removes what it wrote, puts the earlier run back and
    calls `on_failure` (the customer's server stopped)."""
    before = {p.name for p in out.iterdir()} if out.is_dir() else None
    out.mkdir(parents=True, exist_ok=True)
    aside = ckpt.set_aside(out) if fresh and rank == 0 else None
    if aside:
        print(f"muarl: the earlier run in {out} is kept in {aside}", flush=True)
    barrier(world_size)
    try:
        yield
    except BaseException:
        if fresh and rank == 0:
            on_failure()
            ckpt.undo_start(out, before, aside)
        raise


def record_start(out: Path, cfg, sources: list[dict], log, rank: int) -> None:
    """config.json (a changed one keeps the previous beside it) and each data source's provenance (tau2's
    files: path, checksum, revision), printed and logged."""
    if rank == 0:
        save_config(out, cfg)
    for source in sources:
        print(f"[data] {source['domain']}: {source['path']} (sha256 {source['sha256']}; {source['revision']})")
        log({"phase": "data", **source})


def restore(found: Path | None, out: Path, policy, opt, sampler, world_size: int, log) -> tuple[int, dict, int]:
    """(the step to start at, the results so far, the updates made) of checkpoint `found`, its weights,
    AdamW's moments, the task order and the random generators restored, the log's global step put back;
    (0, {}, 0) for a fresh run."""
    if found is None:
        return 0, {}, 0
    start, state = ckpt.load_checkpoint(out, policy, opt, sampler, world_size, found)
    log.global_step = state.get("global_step", 0)
    return start, dict(state.get("results", {})), state.get("updates", start)


def save(out: Path, step: int, policy, opt, sampler, results: dict, updates: int, log, world_size: int,
         rank: int) -> None:
    """A checkpoint: weights, AdamW, the task order, the results, the updates made, the global step."""
    state = {"results": results, "updates": updates, "global_step": log.global_step}
    ckpt.save_checkpoint(out, step, policy, opt, sampler, state, world_size, rank)


def write_record(out: Path, label: str, steps: int, updates: int, data: list, table: str, trials: int,
                 customer: str) -> None:
    """What a finished run leaves beside its model (rank 0): final/muarl.json (what the model is:
    `label`, the steps and updates, the data's provenance), results.md and the held-out table
    printed (`table`: eval.format_table's, "" before any evaluation), curves.png (needs matplotlib; else
    one line) and view.html, the run's page."""
    from plumbing import curves, view

    curves.draw(out)
    view.write(out)  # (also written at every evaluation)
    made = {"model": label, "grpo_steps": steps, "updates": updates, "data": data}
    (out / "final" / "muarl.json").write_text(json.dumps(made))
    if table:
        (out / "results.md").write_text(table + "\n")
        print(f"\nHeld-out success (greedy agent, customer: {customer}, {trials} trial(s) per task)\n{table}")


def finish(out: Path, label: str, steps: int, updates: int, policy, tok, sources: list[dict], table: str,
           trials: int, customer: str, world_size: int, rank: int) -> None:
    """The final model in out/final, and on rank 0 the run's record: final/muarl.json, results.md (`table`),
    curves.png and view.html."""
    ckpt.save_pretrained(policy, tok, out / "final", world_size, rank)
    if rank == 0:
        write_record(out, label, steps, updates, sources, table, trials, customer)


if __name__ == "__main__":  # python -m plumbing.startup: a failed start leaves an earlier run where it was
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="muarl-start-"))
    (out / "log.jsonl").write_text('{"phase": "grpo"}\n')
    try:
        with kept_as_found(out, fresh=True, rank=0, world_size=1, on_failure=lambda: print("on_failure called")):
            (out / "log.jsonl").write_text("a new run's first line\n")
            raise RuntimeError("the start failed")
    except RuntimeError as e:
        print(f"{e}; the folder holds {sorted(p.name for p in out.iterdir())}:", (out / "log.jsonl").read_text())

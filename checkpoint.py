"""Resumable state: the order tasks are drawn in (TaskSampler) and atomic checkpoints.

A checkpoint is written to a temporary folder, then renamed; `latest.json` is replaced atomically last. A process
killed mid-write leaves the previous checkpoint intact, so a crash loses at most the current step, and `--resume`
continues exactly: weights, optimizer state, the sampler's position and every random generator's state
(tests/test_muarl.py kills a run with SIGKILL, and fails each file operation in turn).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from fsdp import barrier, full_state_dict

# ---------------------------------------------------------------------------------------------------------------
# Tasks: a seeded, resumable order over the training tasks (epochs of shuffled passes)


class TaskSampler:
    def __init__(self, tasks: list, seed: int):
        self.tasks, self.seed, self.epoch, self.pos = tasks, seed, 0, 0

    def _order(self) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(self.seed * 100003 + self.epoch).shuffle(order)
        return order

    def next(self, n: int) -> list:
        out = []
        while len(out) < n:
            order = self._order()
            take = order[self.pos : self.pos + n - len(out)]
            out += [self.tasks[i] for i in take]
            self.pos += len(take)
            if self.pos >= len(order):
                self.epoch, self.pos = self.epoch + 1, 0
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, s: dict) -> None:
        self.epoch, self.pos = s["epoch"], s["pos"]


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints: written aside, renamed, then latest.json replaced (atomic at every step)


def save_checkpoint(out: Path, step: int, policy, opt, sampler: TaskSampler, extra: dict, world_size: int, rank: int):
    state = full_state_dict(policy, world_size)
    if world_size > 1:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        optim = get_optimizer_state_dict(policy, opt, options=StateDictOptions(full_state_dict=True))
    else:
        optim = opt.state_dict()
    if rank != 0:
        return
    final = out / "checkpoints" / f"step-{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(state, tmp / "model.pt")
    torch.save(optim, tmp / "optim.pt")
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save({"step": step, "sampler": sampler.state(), "rng": rng, **extra}, tmp / "state.pt")
    if (out / "latest.json").exists() and json.loads((out / "latest.json").read_text())["path"] == final.name:
        # the same step again (the end of a run adds its final evaluation) and latest.json already points here:
        # never remove this folder; swap its files one at a time, each atomically (old and new hold the same step)
        for f in tmp.iterdir():
            os.replace(f, final / f.name)
        tmp.rmdir()
    else:
        shutil.rmtree(final, ignore_errors=True)  # a leftover of a run killed before latest.json pointed to it
        os.replace(tmp, final)
    latest = out / "latest.json"
    (out / "latest.json.tmp").write_text(json.dumps({"step": step, "path": final.name}))
    os.replace(out / "latest.json.tmp", latest)
    for old in sorted((out / "checkpoints").glob("step-*"))[:-2]:  # keep the last two
        if old.name != final.name and not old.name.endswith(".tmp"):
            shutil.rmtree(old, ignore_errors=True)


def save_pretrained(policy, tokenizer, path: Path, world_size: int, rank: int) -> None:
    """The whole model in Hugging Face format (what vLLM, eval.py and load_policy read), written by rank 0 into a
    temporary folder and renamed, so `path` is complete or absent. Every rank calls it: under FSDP gathering the
    weights is a collective, and no rank goes on (e.g. to load the folder) before it is written."""
    state = full_state_dict(policy, world_size)
    # A gathered state dict holds tied weights as separate tensors (lm_head.weight beside the embedding it is tied
    # to), which save_pretrained would write twice; drop the tied copies as it does for an unsharded model.
    if getattr(policy.config, "tie_word_embeddings", False):
        for tied in getattr(policy, "_tied_weights_keys", None) or {}:
            state.pop(tied, None)
    if rank == 0:
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        policy.save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    barrier(world_size)


def load_checkpoint(out: Path, policy, opt, sampler: TaskSampler, world_size: int) -> tuple[int, dict]:
    latest = out / "latest.json"
    if not latest.exists():
        return 0, {}
    path = out / "checkpoints" / json.loads(latest.read_text())["path"]
    state = torch.load(path / "state.pt", weights_only=False)
    model_sd = torch.load(path / "model.pt", weights_only=True)
    optim_sd = torch.load(path / "optim.pt", weights_only=False)
    if world_size > 1:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True)
        set_model_state_dict(policy, model_sd, options=opts)
        set_optimizer_state_dict(policy, opt, optim_sd, options=opts)
    else:
        policy.load_state_dict(model_sd)
        opt.load_state_dict(optim_sd)
    sampler.load(state["sampler"])
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    return state["step"], state


# ---------------------------------------------------------------------------------------------------------------
# Demo: python checkpoint.py — a run saved at step 2 and resumed draws the same tasks and holds the same weights

if __name__ == "__main__":
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="muarl-ckpt-"))
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sampler = TaskSampler([f"task-{i}" for i in range(5)], seed=0)
    for step in range(2):  # two "steps": draw 3 tasks each (crossing an epoch), take an optimizer step
        print(f"step {step}: {sampler.next(3)}")
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    save_checkpoint(out, 2, model, opt, sampler, {"note": "demo"}, world_size=1, rank=0)
    print(f"saved {json.loads((out / 'latest.json').read_text())}: "
          f"{sorted(p.name for p in (out / 'checkpoints' / 'step-000002').iterdir())}")
    then = sampler.next(3)
    # a fresh process would start from scratch: new model, optimizer and sampler, then load the latest checkpoint
    model2, sampler2 = torch.nn.Linear(4, 2), TaskSampler(sampler.tasks, seed=0)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    step, state = load_checkpoint(out, model2, opt2, sampler2, world_size=1)
    print(f"resumed at step {step} ({state['note']}): step 2 draws {sampler2.next(3)} (uninterrupted: {then}); "
          f"same weights: {all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))}")

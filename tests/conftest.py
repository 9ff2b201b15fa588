"""Shared test fixtures: where ../shared/tau2 is, a skip marker for tests that need it, and a guard: the suite leaves
the checkout as it found it (a test's run must never set a user's own runs/muarl aside, nor write into it). The demo's
worlds (shop, store: demo/worlds/) are registered here, as the demo registers them, because many tests play them; a
test that runs a core entry point in a subprocess on them goes through WITH_DEMO_WORLDS."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import demo.worlds  # noqa: E402, F401  (registers "shop" and "store" in domains.DOMAINS)

# `python -c WITH_DEMO_WORLDS.format(script) ARGS`: `python SCRIPT ARGS` (muarl.py, eval.py) with the demo's worlds
# registered first, as a forker's launcher runs a core entry point on the forker's own world.
WITH_DEMO_WORLDS = ("import runpy, sys; import demo.worlds; sys.argv[0] = {0!r}; "
                    "runpy.run_path({0!r}, run_name='__main__')")

TAU2 = REPO.parent / "shared" / "tau2"
HAVE_TAU2 = (TAU2 / "data" / "domains" / "retail" / "db.json").is_file()
needs_tau2 = pytest.mark.skipif(not HAVE_TAU2, reason=f"tau2 data not found at {TAU2} (../shared is absent)")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    # Templates are built into a per-session cache so tests never depend on (or pollute) ~/.cache/muarl.
    import os

    if not os.environ.get("MUARL_CACHE"):
        os.environ["MUARL_CACHE"] = str(tmp_path_factory.mktemp("muarl-cache"))
    yield


def checkout_state() -> dict:
    """Every file git does not track (untracked and ignored: runs/, logs, caches) with its size and mtime, and the
    status of the tracked ones. Byte-code caches are left out: importing a module may write them."""
    import os
    import subprocess

    lines = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    state = {}
    for line in lines:
        path = line[3:]
        if "__pycache__" in path or path.startswith(".pytest_cache"):
            continue
        st = os.stat(REPO / path) if (REPO / path).is_file() else None
        state[path] = (line[:2], st and st.st_size, st and st.st_mtime_ns)
    return state


@pytest.fixture(autouse=True, scope="session")
def _checkout_unchanged():
    # Tests write only under pytest's tmp_path: a run started in the checkout with the default --out_dir would set
    # aside (or write into) the user's own runs/. Checked once, after every test (and every subprocess it started).
    import shutil

    if shutil.which("git") is None or not (REPO / ".git").exists():
        yield
        return
    before = checkout_state()
    yield
    after = checkout_state()
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert not changed, f"the test suite changed the checkout: {changed[:10]}"

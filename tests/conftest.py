"""Shared test fixtures: where ../shared/tau2 is, and a skip marker for tests that need it."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

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

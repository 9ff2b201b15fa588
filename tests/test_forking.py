"""The README's forking recipes, followed verbatim on a scratch copy of the repository, leave it green.

Each recipe in the README's "Forking" section is code blocks, each under a marker saying where it goes
(`<!-- fork: FILE -->` a new file; `<!-- fork: FILE after: TEXT -->` inserted after the first line holding
TEXT), and a check (`<!-- check: COMMAND => OUTPUT -->`). The test copies the tracked files, applies one
recipe, runs its check and the design tests (house style, line budgets, import graph) there.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SECTION = (REPO / "README.md").read_text().split("## Forking", 1)[1].split("\n## ", 1)[0]
RECIPES = [r for r in re.split(r"^#### ", SECTION, flags=re.M)[1:] if "<!-- fork:" in r]
BLOCK = re.compile(r"<!-- fork: (\S+)(?: after: (.+?))? -->\n```python\n(.*?)```", re.S)
CHECK = re.compile(r"<!-- check: (.+?) => (.+?) -->")
DESIGN = "style or top_level or circles or imports_nothing or names_a_domain or skip"


def test_the_readme_has_recipes_with_checks():
    assert len(RECIPES) >= 3, "the README's Forking section lost its recipes"
    for r in RECIPES:
        assert BLOCK.search(r) and CHECK.search(r), f"recipe {r.splitlines()[0]!r} has no code or no check"


def apply(recipe: str, root: Path) -> None:
    for file, anchor, code in BLOCK.findall(recipe):
        path = root / file
        if not anchor:
            assert not path.exists(), f"the recipe would overwrite {file}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(code)
            continue
        lines = path.read_text().split("\n")
        at = next((i for i, line in enumerate(lines) if anchor in line), None)
        assert at is not None, f"{file} has no line with {anchor!r}: the recipe no longer fits the code"
        path.write_text("\n".join(lines[: at + 1] + code.rstrip("\n").split("\n") + lines[at + 1 :]))


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=[r.splitlines()[0] for r in RECIPES])
def test_a_recipe_followed_verbatim_leaves_the_suite_green(recipe, tmp_path):
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    if not names:
        pytest.skip("not a git checkout")
    root = tmp_path / "fork"
    for n in names:
        if (REPO / n).is_file():
            (root / n).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / n, root / n)
    if (REPO.parent / "shared").is_dir():  # (tests that read the tau2 data find it beside the copy)
        (tmp_path / "shared").symlink_to(REPO.parent / "shared")
    apply(recipe, root)
    command, expected = CHECK.search(recipe).groups()
    out = subprocess.run(command, shell=True, cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == expected.strip(), (out.stdout, out.stderr[-2000:])
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                            "tests/test_design.py", "-k", DESIGN], cwd=root, capture_output=True, text=True,
                           timeout=900)
    assert tests.returncode == 0, tests.stdout[-3000:]

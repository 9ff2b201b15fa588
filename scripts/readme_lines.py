"""The README's reading order states each file's length: this rewrites those counts from the files.

    python scripts/readme_lines.py          # README.md's "Reading order" table, counts made true

No test checks those counts (a line count is not behaviour); after a change that moves a file's length, run this,
read the diff and commit it, so the README's pitch stays true.
"""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    readme = REPO / "README.md"
    head, rest = readme.read_text().split("## Reading order", 1)
    table, tail = rest.split("\n#", 1)

    def count(m):
        path = REPO / m.group(1)
        n = len(path.read_text().splitlines()) if path.is_file() else m.group(2)
        return f"| `{m.group(1)}` | {n} |"

    table = re.sub(r"^\| `([\w/.]+)` \| (\d+) \|", count, table, flags=re.M)
    readme.write_text(head + "## Reading order" + table + "\n#" + tail)
    print(table.strip())

"""python -m demo.eval [eval.py's flags]: eval.py, with the demo's worlds registered.

eval.py plays the worlds of domains.DOMAINS. The demo's shop and store join that table when the demo is imported
(demo/worlds/), as a forker's own world joins it when the forker's code is, so a demo run, whose config.json says
--domains store, is evaluated from here:

    python -m demo.eval --model runs/muarl/final      # the run's last figures again, with its own settings

Every flag is eval.py's (python -m demo.eval --help), and so is every line it prints.
"""

import runpy
import sys
from pathlib import Path

import demo  # noqa: F401  (registers the shop and the store)

if __name__ == "__main__":
    sys.argv[0] = "eval.py"
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "eval.py"), run_name="__main__")

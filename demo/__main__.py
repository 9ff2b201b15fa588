"""python -m demo [flags]: the CPU demo of MUA-RL (python -m demo --help lists the flags, the demo's
own last)."""

import sys

from demo.train import parse
from plumbing.flags import ConfigError
from plumbing.validate import early

if __name__ == "__main__":
    try:  # the command line first: --help and a bad flag answer before torch loads
        CLI = parse()
        early(CLI)
    except ConfigError as e:
        print(f"demo: config error: {e}", file=sys.stderr)
        sys.exit(2)
    from demo.train import run
    from plumbing.flags import run_cli

    run_cli(lambda: run(CLI), "demo")

"""Two runs of one seed must be the same run: this compares their logs, number for number.

Every random draw of the CPU demo is seeded: the agent's samples (sampling.episode_seed per episode and turn), the
customer's (one seed per request, derived from the episode's, sent to vLLM's OpenAI server), task order, model
initialisation. So two runs of one command and seed on one machine should write the same log.jsonl, except for
wall-clock fields, and the same results.md. (Across machines floating point differs, and so may the runs: PLATFORM.md.)

    python bench/repro.py runs/a runs/b          # prints the first difference, or "identical"; exit 1 if they differ
    python bench/repro.py runs/a runs/b --ignore long_rows    # a field one of the two codes does not write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# wall-clock fields, and what depends on them (throughput, the customer endpoint's latencies), differ by nature; so do
# where things are (a process id, a port, the served folder's path) and the endpoint's health ("user": its calls,
# retries and latencies, which follow the machine's load; a retried request carries the same seed, so the same reply)
CLOCK = ("_s", "tokens_per_s", "latency", "time", "pid", "base_url")
OPERATIONS = ("user", "model")


def numbers(run: Path, ignore: tuple = ()) -> list[dict]:
    """log.jsonl without its clock fields (recursively), its operational ones and `ignore`, one dict per record."""
    def strip(x, top=False):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if not any(c in k for c in CLOCK) and k not in ignore
                    and not (top and k in OPERATIONS and (k == "user" or x.get("phase") == "customer_server"))}
        return [strip(v) for v in x] if isinstance(x, list) else x

    return [strip(json.loads(line), top=True) for line in (run / "log.jsonl").read_text().splitlines()]


def compare(a: Path, b: Path, ignore: tuple = ()) -> str | None:
    """The first difference between two runs' logs and results tables; None when they are the same."""
    la, lb = numbers(a, ignore), numbers(b, ignore)
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            return f"log.jsonl record {i} ({x.get('phase')}) differs in {keys[:6]}"
    if len(la) != len(lb):
        return f"log.jsonl has {len(la)} records in {a} and {len(lb)} in {b}"
    ra, rb = ((r / "results.md").read_text() if (r / "results.md").is_file() else None for r in (a, b))
    return None if ra == rb else "results.md differs"


if __name__ == "__main__":
    args, ignore = sys.argv[1:], ()
    if "--ignore" in args:
        i = args.index("--ignore")
        args, ignore = args[:i] + args[i + 2 :], tuple(args[i + 1].split(","))
    if len(args) != 2:
        sys.exit("usage: python bench/repro.py RUN_A RUN_B [--ignore KEY,...]")
    diff = compare(Path(args[0]), Path(args[1]), ignore)
    print(diff or f"identical: {len(numbers(Path(args[0])))} log records and results.md" +
          (f" (leaving out {', '.join(ignore)})" if ignore else ""))
    sys.exit(1 if diff else 0)

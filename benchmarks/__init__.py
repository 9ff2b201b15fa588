"""Evaluation-only benchmarks: worlds an agent is measured on, never trained on in the paper's recipe.

    python eval.py --bench bfcl_multi_turn --agent oracle     # BFCL-v3 multi-turn, the gold calls replayed
    python eval.py --bench acebench_agent --agent oracle      # ACEBench Agent, the answers replayed

    bench.py            Bench: a benchmark's row of domains.BENCHES (its world, its rules, its figures)
    bfcl.py             BFCL-v3 multi-turn as a world: BFCL's backends, its checker, its scripted turns
    bfcl_data.py        where BFCL's data comes from; its function docs as tool schemas, its gold calls as tool calls
    acebench.py         ACEBench Agent as a world: its router, its stop rule, its evaluator
    acebench_apps.py    ACEBench's five apps: a phone (messages, reminders, food delivery) and an airline's bookings
    acebench_agents.py  ACEBench's agent protocol (oracle, endpoint, local model) and its category summary
    acebench_customer.py  ACEBench's simulated user: the LLM customer told ACEBench's own prompt

Each benchmark is a world behind the interfaces every world has (domains/base.py: tools, parse_turn, ends, score)
plus a row of domains.BENCHES; their special cases live in these files, not in the training loop.
"""

# The registry first: it lists this folder's worlds in domains.DOMAINS and its benchmarks in domains.BENCHES, and
# importing one of these files before it would leave the registry reading a half-built module.
import domains  # noqa: F401

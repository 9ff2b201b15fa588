"""What eval.py measures with, beside the loop it shares with training: its command line and
settings (flags.py), and the agents it can evaluate that are not the trained policy (agents.py:
a model behind any OpenAI-compatible endpoint, the oracle that replays a task's gold actions, and
a token engine that plays a generated task's scripted expert)."""

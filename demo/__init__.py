"""The CPU demo's kit, beside the core: what lets a laptop stand in for a GPU cluster and GPT-4o.

    customer.py      the store's customer model: its data, its training, its fidelity gate, the shipped model
    customer_model/  that model, trained once and committed (a fixed simulator, as the paper's GPT-4o is)
    serve.py         a local model served as users serve models: vLLM's OpenAI server on 127.0.0.1
    curves.py        the training dynamics drawn from a run's log.jsonl
    baselines.py     rule policies (customer-blind and not) and the per-behaviour table of a run

Nothing in the core (the top-level files) is needed to read MUA-RL; this folder is how the demo runs it on a CPU.
"""

"""What a reader of MUA-RL may skip: the machinery around the loop, one concept a file.

    flags.py        the command line -> a settings dataclass: grouped flags, --config, --resume, one-line errors
    validate.py     a configuration that cannot work, refused before any work
    startup.py      what muarl.train calls by name: resume, a failed start left as found, checkpoints, the record
    checkpoint.py   atomic checkpoints with checksummed manifests, resume
    runlog.py       what a run writes as it goes: log.jsonl (one global step, strict JSON), each step's statistics,
                    samples.txt, the page's token records
    preflight.py    which key may go to which endpoint; every endpoint checked once before any work
    chat_client.py  one chat completion that survives a flaky endpoint (deadline, retries, health)
    serve.py        a local model served by vLLM's OpenAI server, and the customer it plays
    models.py       loading the policy, its tokenizer and the frozen reference
    fsdp.py         FSDP2 under torchrun: placement, sharding, sharded loading, gathering, reductions
    memory_plan.py  what each GPU holds in both phases of a step, from config.json alone
    sampling.py     how a token is drawn (temperature, top-p, its log-prob) and from which seed
    hf_engine.py    the transformers engine: a batched decode loop over a buffer-backed KV cache, each
                    conversation's keys/values kept across turns
    curves.py       a run's training dynamics drawn from its log.jsonl
    view.py         a run's page (view.html), built from its files: every conversation, the trained tokens lit,
                    each reward explained

Nothing here is needed to read how MUA-RL works: the top-level files are. Nothing here imports them
(tests/test_layout.py). The tiny model the CPU demo and the tests build is the demo's (demo/tiny_model.py).
eval.py's command line and the agents it evaluates besides the policy are in evaluation/.
"""

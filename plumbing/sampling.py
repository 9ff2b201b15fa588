"""How a token is drawn, and from which random stream: the sampling step every engine shares, and
the seeds.

    sampler_logprobs  logits (B, V) -> the log-probs a token is drawn from (temperature, top-p), for engine and trainer
    sample_step       logits (B, V) -> a token per row and its log-prob under the distribution it was drawn from
                      (temperature, then the top-p nucleus, renormalised). GRPO's `old_logp` is this
                      log-prob.
    episode_seed      THE seed function: a 63-bit int hashed from any parts (rollout.py: one per episode and turn)
    prompt_seeds      one generator seed per prompt of a generate() call (a list, an int, or None)
    Sample            what an engine returns per prompt: token_ids, logprobs, finish_reason
    default_stop_ids  the ids that end an agent turn

Symbols: B = prompts (rows) in a batch, V = vocabulary size.

Departures from the paper's setup (verl + vLLM sample with vLLM's own sampler):
1. An inverse-CDF draw from one uniform u per row and step, not torch.multinomial: the same
   distribution, ~20x cheaper on a CPU, and the HF engines draw a prompt's u's ahead from its own
   stream: its tokens ignore its batch.
2. Seeds are hashed (blake2b), not added: episode_seed(7, "shop/3", 0, 1) and episode_seed(7,
   "shop/3", 1, 0) are unrelated streams, where a sum like seed + j would make neighbouring runs
   replay each other's episodes.

    python -m plumbing.sampling   # sample_step on a toy logit row; episode_seed of a few parts
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch


@dataclass
class Sample:
    token_ids: list[int] = field(default_factory=list)  # sampled ids; a stop token, if hit, is the last one
    logprobs: list[float] = field(default_factory=list)  # log p(token) under the sampler's distribution
    finish_reason: str = "length"  # "stop" | "length"


def default_stop_ids(tokenizer=None, model=None) -> list[int]:
    """The ids that end a turn: the generation config's eos id(s) plus the tokenizer's eos
    (<|im_end|>)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = (eos if isinstance(eos, list) else [eos]) + [getattr(tokenizer, "eos_token_id", None)]
    return sorted({i for i in ids if i is not None})


# --------------------------------------------------------------------------------------------------
# 1. Sampling one step: temperature, top-p, and the log-prob of what was drawn


def sampler_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """logits (..., V) -> log-probs (..., V) of the distribution a token is drawn from: temperature,
    then the top-p nucleus renormalised (-inf outside it); temperature 0 (greedy) reports the
    untempered model's. The trainer calls it too (grpo.token_logprobs), so the engine's and the
    trainer's log-probs of a token compare like with like."""
    logp = (logits.float() / (temperature or 1.0)).log_softmax(-1)  # (..., V)
    if top_p < 1.0 and temperature > 0:
        # Nucleus: keep the smallest set of most likely tokens whose mass reaches top_p, renormalise.
        sorted_logp, order = logp.sort(-1, descending=True)  # (..., V) each
        mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()  # (..., V) mass of strictly better tokens
        drop_sorted = mass_before >= top_p  # (..., V); the top token always has mass_before 0, so it stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # (..., V) back in vocabulary order
        logp = logp.masked_fill(drop, float("-inf")).log_softmax(-1)  # (..., V) renormalised over the nucleus
    return logp


def sample_step(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None = None,
                u: torch.Tensor | None = None):
    """logits (B, V) -> (tokens (B,), their logprobs (B,)); u (B,): a uniform in [0, 1) per row,
    else drawn from gen."""
    logits = logits.float()  # sample in float32 whatever the model dtype
    if temperature == 0:  # greedy: the log-prob is that of the untempered model
        tok = logits.argmax(-1)  # (B,)
        return tok, logits.log_softmax(-1).gather(-1, tok[:, None])[:, 0]
    logp = sampler_logprobs(logits, temperature, top_p)  # (B, V)
    # Inverse CDF (multinomial: ~45 us a row): the first token whose cumulative probability exceeds
    # u * total. Never a probability-0 token: it needs cdf[i] > u * total >= cdf[i-1] = cdf[i].
    # Clamp: u * total may round up to cdf[-1].
    cdf = logp.exp().double().cumsum(-1)  # (B, V) in float64: no drift over a 150k vocabulary
    if u is None:
        u = torch.rand(len(cdf), generator=gen, dtype=torch.float64, device=cdf.device)  # (B,)
    tok = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True).clamp(max=cdf.shape[-1] - 1)[:, 0]  # (B,)
    return tok, logp.gather(-1, tok[:, None])[:, 0]


# --------------------------------------------------------------------------------------------------
# 2. Random streams: one seed per episode and turn, one generator per prompt


def episode_seed(*parts) -> int:
    """A 63-bit seed (fits manual_seed and an int64) hashed from `parts` (anything with a str()):
    equal parts give equal seeds on any machine and Python (blake2b, unlike hash(), is not salted);
    any other part, an unrelated one."""
    digest = hashlib.blake2b("/".join(str(p) for p in parts).encode(), digest_size=8).digest()  # 8 bytes
    return int.from_bytes(digest, "little") >> 1  # 64 bits -> 63: a non-negative int64


def prompt_seeds(seed: int | list[int] | None, n: int) -> list[int]:
    """One generator seed per prompt: `seed` itself when it is a list (rollout.py: one per episode
    and turn), episode_seed(seed, i) for prompt i when it is an int, fresh seeds from torch's global
    RNG when it is None."""
    if isinstance(seed, (list, tuple)):
        if len(seed) != n:
            raise ValueError(f"generate: {len(seed)} seeds for {n} prompts (give one per prompt, or one int)")
        return [int(s) % 2**63 for s in seed]
    return torch.randint(2**62, (n,)).tolist() if seed is None else [episode_seed(seed, i) for i in range(n)]


# --------------------------------------------------------------------------------------------------
# Demo: python -m plumbing.sampling

if __name__ == "__main__":
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])  # (1, V = 5): one row of a toy vocabulary
    print("probabilities:", [round(p, 3) for p in logits.softmax(-1)[0].tolist()])
    for temperature, top_p in ((0.0, 1.0), (1.0, 1.0), (1.0, 0.7), (2.0, 1.0)):
        gen = torch.Generator().manual_seed(0)
        draws = [sample_step(logits, temperature, top_p, gen) for _ in range(2000)]
        counts = torch.bincount(torch.cat([t for t, _ in draws]), minlength=5)  # (V,)
        lps = {int(t): round(float(lp), 3) for t, lp in draws}
        print(f"T={temperature} top_p={top_p}: frequencies {[round(c / 2000, 3) for c in counts.tolist()]}, "
              f"log-probs {dict(sorted(lps.items()))}")
    print("episode_seed(0, 'shop/3', 0, 1) =", episode_seed(0, "shop/3", 0, 1))
    print("episode_seed(0, 'shop/3', 1, 0) =", episode_seed(0, "shop/3", 1, 0), "(another occurrence: unrelated)")
    print("turn 2 of the first:          ", episode_seed(episode_seed(0, "shop/3", 0, 1), 2))
    print("prompt_seeds(5, 3) =", prompt_seeds(5, 3), "= [episode_seed(5, i) for i in 0..2]")

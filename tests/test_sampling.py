"""plumbing/sampling.py: the sampling step on hand-made logits, and the seeds (episode_seed pinned to its bytes)."""

import hashlib

import pytest
import torch

from plumbing.sampling import episode_seed, prompt_seeds, sample_step


def test_sample_step_top_p_keeps_top_token():
    logits = torch.tensor([[5.0, 0.0, 0.0, 0.0]])  # the top token alone holds > 0.9 of the mass
    tok, lp = sample_step(logits, 1.0, 0.1, torch.Generator().manual_seed(0))
    assert tok.item() == 0 and lp.item() == pytest.approx(0.0, abs=1e-6)  # a nucleus of one: prob 1


def test_sample_step_inverts_the_cdf():
    # probabilities 0.5, 0.25, 0.25: u in [0, 0.5) draws token 0, [0.5, 0.75) token 1, [0.75, 1) token 2
    logits = torch.tensor([[0.5, 0.25, 0.25]]).log().expand(6, 3)  # (6, 3): six rows, one distribution
    u = torch.tensor([0.0, 0.49, 0.5, 0.74, 0.75, 0.999], dtype=torch.float64)  # (6,) one draw per row
    tok, lp = sample_step(logits, 1.0, 1.0, u=u)
    assert tok.tolist() == [0, 0, 1, 1, 2, 2]
    assert lp.tolist() == pytest.approx([-0.6931, -0.6931, -1.3863, -1.3863, -1.3863, -1.3863], abs=1e-4)
    # top-p 0.6: the nucleus is {0, 1} (mass before token 2 is 0.75 >= 0.6), renormalised to 2/3, 1/3
    tok, lp = sample_step(logits, 1.0, 0.6, u=u)
    assert tok.tolist() == [0, 0, 0, 1, 1, 1]  # the cut at 2/3 of the draw
    assert lp.tolist() == pytest.approx([-0.4055] * 3 + [-1.0986] * 3, abs=1e-4)
    # greedy ignores the draw and reports the untempered log-prob
    tok, lp = sample_step(logits, 0.0, 1.0, u=u)
    assert tok.tolist() == [0] * 6 and lp[0].item() == pytest.approx(-0.6931, abs=1e-4)


def test_episode_seed_is_blake2b_of_the_joined_parts():
    parts = (0, "shop/3", 0, 1)
    digest = hashlib.blake2b(b"0/shop/3/0/1", digest_size=8).digest()
    assert episode_seed(*parts) == int.from_bytes(digest, "little") >> 1 == 6864869610302318676  # pinned
    assert 0 <= episode_seed(*parts) < 2**63  # fits torch.Generator.manual_seed and an int64
    assert episode_seed(0, "shop/3", 1, 0) != episode_seed(*parts)  # any part changed: another stream
    assert episode_seed(episode_seed(*parts), 2) != episode_seed(episode_seed(*parts), 3)  # turns of one episode


def test_prompt_seeds():
    assert prompt_seeds(5, 3) == [episode_seed(5, i) for i in range(3)]  # an int: prompt i hashed from (seed, i)
    assert prompt_seeds(6, 3)[0] not in prompt_seeds(5, 3)  # neighbouring calls do not replay each other
    assert prompt_seeds([1, -1, 2**64 + 3], 3) == [1, 2**63 - 1, 3]  # a list: one per prompt, as int64 seeds
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        prompt_seeds([1, 2], 3)
    fresh = prompt_seeds(None, 4)  # None: fresh seeds from torch's global generator
    assert len(fresh) == 4 and all(0 <= s < 2**62 for s in fresh)

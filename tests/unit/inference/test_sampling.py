"""The embedded engine's batched sampler: exact draws, top-p, greedy, the log-prob convention, and
per-request streams that do not depend on the batch."""

import math

import pytest
import torch

from composer_prime.model import sampling
from composer_prime.model.sampling import nucleus_mask, sample, stream_keys, uniforms

M64 = (1 << 64) - 1


def splitmix(z: int) -> int:
    """splitmix64's finaliser on Python ints: the reference the tensor version must equal bit for bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def reference_uniform(seed: int, counter: int) -> float:
    key = splitmix((seed + 0x9E3779B97F4A7C15) & M64)
    return (splitmix((key + counter * 0x9E3779B97F4A7C15) & M64) >> 11) * 2.0**-53


def draw(logits: list[float], n: int, temp: float = 1.0, top_p: float = 1.0, seed: int = 0) -> torch.Tensor:
    """Frequencies of n draws of one row: its tokens 0..n-1 (the counter), as a request would draw them."""
    rows = torch.tensor([logits]).expand(n, -1)
    tokens, _ = sample(rows, torch.full((n,), temp), torch.full((n,), top_p), stream_keys([seed]).expand(n),
                       torch.arange(n), top_p < 1)
    return torch.bincount(tokens, minlength=len(logits)).float() / n


def test_uniforms_are_splitmix64_of_seed_and_counter_for_any_seed():
    seeds = [0, 1, 7, 2**63 - 1, 2**63, 2**64 + 5, -3, 123456789012345678901234567890]
    counters = [0, 1, 2, 1000, 2**40]
    got = uniforms(stream_keys(seeds)[:, None].expand(-1, len(counters)), torch.tensor(counters).expand(len(seeds), -1))
    want = [[reference_uniform(s, c) for c in counters] for s in seeds]
    assert got.dtype == torch.float64 and got.tolist() == want  # exactly, all 53 bits
    assert all(0 <= u < 1 for row in want for u in row) and len({u for row in want for u in row}) == 40
    assert stream_keys([2**64 + 5]).tolist() == stream_keys([5]).tolist()  # a seed counts modulo 2^64


def test_draws_follow_the_tempered_distribution():
    p = torch.tensor([0.6, 0.3, 0.1])
    assert torch.allclose(draw(p.log().tolist(), 6000), p, atol=0.02)  # 3 sigma of a 6000-draw frequency: 0.019
    hot = torch.softmax(p.log() / 2.0, -1)  # temperature 2 flattens: [0.4634, 0.3277, 0.1892]
    assert torch.allclose(draw(p.log().tolist(), 6000, temp=2.0, seed=1), hot, atol=0.02)
    tiny = torch.tensor([1e-4, 1 - 1e-4])  # a rare token keeps its share, neither lost nor inflated
    assert 0 < draw(tiny.log().tolist(), 60000, seed=4)[0] * 60000 < 20  # expected 6


def test_top_p_keeps_the_nucleus_only_and_greedy_takes_the_argmax():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert nucleus_mask(p, torch.tensor([0.7])).tolist() == [[True, True, False, False]]
    assert nucleus_mask(p * 7, torch.tensor([0.7])).tolist() == [[True, True, False, False]]  # unnormalised
    assert nucleus_mask(p, torch.tensor([0.01])).tolist() == [[True, False, False, False]]
    freq = draw(p.log()[0].tolist(), 2000, top_p=0.7, seed=2)
    assert freq[2] == 0 and freq[3] == 0 and abs(freq[0] - 0.625) < 0.04  # renormalised 0.5/0.8
    tok, lp = sample(torch.tensor([[1.0, 3.0, 2.0]]), torch.tensor([0.0]), torch.tensor([1.0]), stream_keys([0]),
                     torch.tensor([0]), False)
    assert tok.item() == 1 and lp.item() == pytest.approx(0.0, abs=1e-6)


def test_tokens_tied_at_the_nucleus_edge_are_kept_lowest_id_first_whatever_the_sort():
    # bfloat16 logits (CUDA's default) tie often; an unstable sort puts ties in its kernel's own order,
    # on the CPU not by id already, so which of them the nucleus kept would differ between devices
    probs = torch.randint(1, 5, (8, 3000), generator=torch.Generator().manual_seed(0)).float()
    keep = nucleus_mask(probs, torch.full((8,), 0.5))
    for row, kept in zip(probs, keep):
        edge = row[kept].min()  # the least likely kept probability: its tokens are split at the edge
        tied = (row == edge).nonzero().flatten()
        n = int(kept[tied].sum())
        assert 0 < n < len(tied) and kept[tied[:n]].all() and not kept[tied[n:]].any()
        assert kept[row > edge].all() and not kept[row < edge].any()


def test_a_uniform_at_the_top_of_the_cdf_never_draws_a_token_outside_the_nucleus(monkeypatch):
    # u * total can round up to the total itself: the search then runs past the last kept token
    monkeypatch.setattr(sampling, "uniforms", lambda keys, counters: torch.full(keys.shape, 1.0, dtype=torch.float64))
    logits = torch.tensor([[3.0, 2.0, -1.0, -2.0]])  # top-p 0.9 keeps tokens 0 and 1 only
    tok, _ = sample(logits, torch.tensor([1.0]), torch.tensor([0.9]), stream_keys([0]), torch.tensor([0]), True)
    assert tok.item() == 0  # the mode, not token 3 (the last index) nor a masked one


def test_log_prob_is_of_the_tempered_untruncated_distribution_and_streams_ignore_the_batch():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    tok, lp = sample(logits, torch.tensor([0.5]), torch.tensor([0.9]), stream_keys([5]), torch.tensor([0]), True)
    expect = torch.log_softmax(logits / 0.5, -1)[0, tok.item()].item()
    assert math.isclose(lp.item(), expect, rel_tol=1e-6)
    # the same seed and counter give the same token alone and as row 2 of a batch of three
    alone = [sample(logits, torch.ones(1), torch.ones(1), stream_keys([9]), torch.tensor([c]), False)[0].item()
             for c in range(20)]
    batch = torch.tensor([[0.0, 0.0, 5.0], [1.0, 1.0, 1.0], [2.0, 1.0, 0.0]])
    inside = [sample(batch, torch.ones(3), torch.tensor([0.5, 1.0, 1.0]), stream_keys([1, 2, 9]), torch.tensor([7, 0, c]),
                     True)[0][2].item() for c in range(20)]
    assert alone == inside and len(set(alone)) > 1

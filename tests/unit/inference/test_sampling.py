"""The embedded engine's batched sampler: exact draws, top-p, greedy, and the log-prob convention."""

import math

import torch

from composer_prime.inference.engines.sampling import nucleus_mask, sample_step


def draw(logits: list[float], n: int, temp: float = 1.0, top_p: float = 1.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    row = torch.tensor([logits])
    out = [sample_step(row, torch.tensor([temp]), torch.tensor([top_p]), [g], torch.tensor([True]))[0].item()
           for _ in range(n)]
    return torch.bincount(torch.tensor(out), minlength=len(logits)).float() / n


def test_gumbel_max_draws_follow_the_tempered_distribution():
    p = torch.tensor([0.6, 0.3, 0.1])
    freq = draw(p.log().tolist(), 6000)
    assert torch.allclose(freq, p, atol=0.02)  # 3 sigma of a 6000-draw frequency is about 0.019
    hot = torch.softmax(p.log() / 2.0, -1)  # temperature 2 flattens: [0.4634, 0.3277, 0.1892]
    assert torch.allclose(draw(p.log().tolist(), 6000, temp=2.0, seed=1), hot, atol=0.02)


def test_top_p_keeps_the_nucleus_only_and_greedy_takes_the_argmax():
    logp = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert nucleus_mask(logp, torch.tensor([0.7])).tolist() == [[True, True, False, False]]
    assert nucleus_mask(logp, torch.tensor([0.01])).tolist() == [[True, False, False, False]]
    freq = draw(logp[0].tolist(), 2000, top_p=0.7, seed=2)
    assert freq[2] == 0 and freq[3] == 0 and abs(freq[0] - 0.625) < 0.04  # renormalised 0.5/0.8
    tok, lp = sample_step(torch.tensor([[1.0, 3.0, 2.0]]), torch.tensor([0.0]), torch.tensor([1.0]),
                          [torch.Generator()], torch.tensor([True]))
    assert tok.item() == 1


def test_log_prob_is_of_the_tempered_untruncated_distribution_and_seeds_reproduce():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    g = torch.Generator().manual_seed(5)
    tok, lp = sample_step(logits, torch.tensor([0.5]), torch.tensor([0.9]), [g], torch.tensor([True]))
    expect = torch.log_softmax(logits / 0.5, -1)[0, tok.item()].item()
    assert math.isclose(lp.item(), expect, rel_tol=1e-6)
    # the same seed gives the same token in a batch of one and in a batch of three
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    alone = [sample_step(logits, torch.tensor([1.0]), torch.tensor([1.0]), [g1], torch.tensor([True]))[0].item()
             for _ in range(20)]
    batch = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0], [1.0, 1.0, 1.0]])
    others = [torch.Generator().manual_seed(s) for s in (1, 2)]
    inside = [sample_step(batch, torch.ones(3), torch.ones(3), [g2, *others], torch.ones(3, dtype=torch.bool))[0][0].item()
              for _ in range(20)]
    assert alone == inside and len(set(alone)) > 1

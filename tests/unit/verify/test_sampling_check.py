"""The validator's sampling checks (verify/sampling.py) against the embedded engine's own sampler:
its draws replay at distance 0 with their log-probs; a token the seed did not draw lies at least
its CDF gap away; another seed or temperature disagrees; claimed log-probs are compared exactly."""

import pytest
import torch

from composer_prime.config.sampling import SamplingParams
from composer_prime.model.sampling import draw_distance, sample, stream_keys
from composer_prime.verify import sampling


def draws(n: int = 50, vocab: int = 40, seed: int = 7, temperature: float = 1.0, top_p: float = 1.0):
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(0)) * 2
    temps, tp = torch.full((n,), temperature), torch.full((n,), top_p)
    tokens, logprobs = sample(logits, temps, tp, stream_keys([seed] * n), torch.arange(n), top_p < 1)
    return logits, tokens, logprobs


def test_the_engines_own_draws_pass_exactly():
    for top_p in (1.0, 0.8):
        logits, tokens, logprobs = draws(top_p=top_p)
        c = sampling.check(logits, tokens.tolist(), logprobs.tolist(), SamplingParams(top_p=top_p), 7)
        assert (c.replay_mismatches, c.max_draw_distance, c.tokens) == (0, 0.0, 50)
        assert c.logprob_max_err < 1e-6


def test_a_token_not_drawn_is_its_gap_away():
    # p = (0.2, 0.3, 0.5): CDF intervals [0, 0.2), [0.2, 0.5), [0.5, 1); seed 7's first draw is u = 0.45590
    logits = torch.tensor([[0.2, 0.3, 0.5]]).log()
    d = [draw_distance(logits, torch.ones(1), torch.ones(1), stream_keys([7]), torch.zeros(1, dtype=torch.long),
                       torch.tensor([t])).item() for t in range(3)]
    assert d == pytest.approx([0.45590 - 0.2, 0.0, 0.5 - 0.45590], abs=1e-5)


def test_another_seed_or_temperature_or_claimed_logprobs_disagree():
    logits, tokens, logprobs = draws()
    ids, lps = tokens.tolist(), logprobs.tolist()
    assert sampling.check(logits, ids, lps, SamplingParams(), 8).max_draw_distance > 1e-3
    assert sampling.check(logits, ids, lps, SamplingParams(temperature=0.5), 7).logprob_max_err > 0.1
    shifted = [x - 0.01 for x in lps]
    assert abs(sampling.check(logits, ids, shifted, SamplingParams(), 7).logprob_max_err - 0.01) < 1e-5

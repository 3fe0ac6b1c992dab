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


def test_a_claimed_logprob_past_float32s_range_is_a_finite_error():
    """-3.4028235677973366e38 is a finite float the door lets through, and -inf in float32: the error must stay
    a number the audit's JSON answer can carry (it was inf, sent as null: the validator raised, in a fuzz run)."""
    logits, tokens, logprobs = draws(n=1)
    c = sampling.check(logits, tokens.tolist(), [-3.4028235677973366e38], SamplingParams(), 7)
    assert c.logprob_max_err == pytest.approx(3.4028235677973366e38 + logprobs.item(), rel=1e-12)


def test_honest_draws_pass_the_statistics_and_picked_or_improbable_tokens_do_not():
    """Over 40 seeds of 64 draws each: n x min p-value never below 1e-3 and z within 4.5 (its
    honest spread); the likeliest token every time: z far below; one token no draw would give: a
    p-value that small. At top-p 0.8 alike (the nucleus renormalised)."""
    logits = torch.randn(64, 200, generator=torch.Generator().manual_seed(1)) * 2
    for top_p in (1.0, 0.8):
        params = SamplingParams(top_p=top_p)
        honest = [sampling.check(logits, *[t.tolist() for t in sample(
            logits, torch.ones(64), torch.full((64,), top_p), stream_keys([s] * 64), torch.arange(64), top_p < 1)],
            params, s) for s in range(40)]
        assert min(c.min_pvalue for c in honest) > 1e-3 and max(abs(c.surprisal_z) for c in honest) < 4.5
        assert abs(sum(c.surprisal_z for c in honest) / 40) < 0.5  # centred
        greedy = logits.argmax(-1)
        assert sampling.check(logits, greedy.tolist(), [0.0] * 64, params, 0).surprisal_z < -8
        ids = sample(logits, torch.ones(64), torch.full((64,), top_p), stream_keys([0] * 64), torch.arange(64),
                     top_p < 1)[0]
        ids[10] = logits[10].argmin()
        assert sampling.check(logits, ids.tolist(), [0.0] * 64, params, 0).min_pvalue < 1e-3 < honest[0].min_pvalue


def test_the_p_value_and_z_by_hand():
    # q = (0.2, 0.3, 0.5); token 1: p-value 0.2 + 0.3 = 0.5, one token: n x min = 0.5
    # s = -log 0.3 = 1.20397, H = 1.02965, V = sum q log^2 q - H^2 = 1.19315 - 1.06018 = 0.13296 -> z = 0.47806
    c = sampling.check(torch.tensor([[0.2, 0.3, 0.5]]).log(), [1], [0.0], SamplingParams(), 0)
    assert (c.min_pvalue, c.surprisal_z) == (pytest.approx(0.5), pytest.approx(0.47806, abs=1e-4))

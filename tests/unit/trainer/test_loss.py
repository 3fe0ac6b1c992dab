"""Every objective pinned to hand-computed numbers (../shared/DESIGN.md §3), values and gradients."""

import math

import pytest
import torch

from composer_prime.config.models import LossConfig
from composer_prime.trainer.loss import Counts, LossInputs, Objective, token_logprobs
from composer_prime.trainer.loss.rl import RLLossConfig, rl_loss

CFG = RLLossConfig(eps_low=0.2, eps_high=0.28, is_cap=2.0)


def grad_of(logp: float, old: float, mu: float, adv: float, cfg: RLLossConfig = CFG, ref: float | None = None):
    lp = torch.tensor([logp], requires_grad=True)
    loss, stats = rl_loss(lp, torch.tensor([old]), torch.tensor([mu]), torch.tensor([adv]), torch.tensor([1.0]), cfg,
                          None if ref is None else torch.tensor([ref]))
    loss.backward()
    return loss.item(), lp.grad.item(), stats


# (rho, A) -> (loss, d loss / d logp): clipped branch => zero gradient
SURROGATE = {
    (0.5, 1.0): (-0.5, -0.5),   # below the band but A > 0: the unclipped (smaller) term is taken
    (0.5, -1.0): (0.8, 0.0),    # clipped at 1 - 0.2
    (1.0, 1.0): (-1.0, -1.0),
    (1.0, -1.0): (1.0, 1.0),
    (1.5, 1.0): (-1.28, 0.0),   # clipped at 1 + 0.28 (clip-higher)
    (1.5, -1.0): (1.5, 1.5),    # pessimistic unclipped term, gradient rho * |A|
}


@pytest.mark.parametrize("rho, adv", SURROGATE)
def test_clipped_surrogate_values_and_gradients(rho, adv):
    loss, grad, stats = grad_of(math.log(rho), 0.0, 0.0, adv)
    assert (loss, grad) == pytest.approx(SURROGATE[(rho, adv)])
    assert stats["clipped"].item() == (1.0 if SURROGATE[(rho, adv)][1] == 0.0 else 0.0)


def test_truncated_importance_weight_is_capped_and_detached():
    _, grad, stats = grad_of(0.0, 0.0, math.log(1 / 3), 1.0)  # pi_old / mu = 3 -> capped at 2
    assert grad == pytest.approx(-2.0) and stats["is_truncated"].item() == 1.0
    _, grad, _ = grad_of(0.0, 0.0, math.log(10), 1.0)  # pi_old / mu = 0.1
    assert grad == pytest.approx(-0.1)


def test_ratio_band_masking_drops_tokens_outside_the_band():
    cfg = RLLossConfig(off_policy="mask", mask_low=0.5, mask_high=2.0)
    loss, grad, stats = grad_of(0.0, 0.0, math.log(1 / 3), 1.0, cfg)  # pi_old / mu = 3: outside
    assert (loss, grad, stats["masked"].item()) == (0.0, 0.0, 1.0)
    loss, grad, stats = grad_of(0.0, 0.0, math.log(1 / 1.5), 1.0, cfg)  # 1.5: inside, weight exactly 1
    assert (loss, grad, stats["masked"].item()) == (pytest.approx(-1.0), pytest.approx(-1.0), 0.0)


def test_two_sided_clip_bounds_negative_advantage_losses():
    cfg = RLLossConfig(two_sided_delta=4.0)
    loss, grad, _ = grad_of(math.log(5.0), 0.0, 0.0, -1.0, cfg)
    assert loss == pytest.approx(4.0) and grad == 0.0  # delta * |A|, constant in pi
    loss, grad, _ = grad_of(math.log(5.0), 0.0, 0.0, -1.0, CFG)  # without it: rho * |A| and its gradient
    assert loss == pytest.approx(5.0) and grad == pytest.approx(5.0)
    loss, grad, _ = grad_of(math.log(5.0), 0.0, 0.0, 1.0, cfg)  # A > 0 is untouched: clipped at 1.28
    assert loss == pytest.approx(-1.28) and grad == 0.0


def test_k3_kl_to_the_reference():
    cfg = RLLossConfig(kl_coef=0.1)
    loss, grad, stats = grad_of(-1.0, -1.0, -1.0, 0.0, cfg, ref=-2.0)
    kl = math.exp(-1.0) + 1.0 - 1.0  # exp(ref - lp) - (ref - lp) - 1 = e^-1 + 1 - 1
    assert loss == pytest.approx(0.1 * kl) and grad == pytest.approx(0.1 * (1 - math.exp(-1.0)))
    assert stats["ref_kl"].item() == pytest.approx(kl)
    with pytest.raises(ValueError, match="reference log-probs"):
        grad_of(-1.0, -1.0, -1.0, 0.0, cfg)


def two_sequences(norm: str):
    """Lengths 2 and 4, on-policy, A = -1 and -2: per-token losses 1 and 2 (sum 10)."""
    lp = torch.zeros(2, 4, requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0, 0.0, 0.0], [-2.0] * 4])
    w = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0] * 4])
    cfg = LossConfig(rl=RLLossConfig(norm=norm, norm_constant=4))
    loss, _ = Objective(cfg).loss(LossInputs(lp, lp.detach(), lp.detach(), adv), {"rl": w}, Counts({"rl": 6}, {"rl": 2}))
    loss.backward()
    return loss.item(), lp.grad[0, 0].item(), lp.grad[1, 0].item()


@pytest.mark.parametrize("norm, want", [
    ("token", (10 / 6, 1 / 6, 2 / 6)),     # DAPO: every token counts the same
    ("sequence", (1.5, 1 / 4, 2 / 8)),     # GRPO: mean per sequence, then over sequences
    ("constant", (10 / 8, 1 / 8, 2 / 8)),  # Dr.GRPO: sum / (sequences * 4)
])
def test_dapo_grpo_drgrpo_normalisations(norm, want):
    assert two_sequences(norm) == pytest.approx(want)


def test_channels_are_normalised_by_their_own_token_counts():
    lp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    weights = {"rl": torch.tensor([[1.0, 1.0, 0.0]]), "ce": torch.tensor([[0.0, 0.0, 1.0]])}
    adv = torch.tensor([[0.5, -1.0, 0.0]])
    x = LossInputs(lp, lp.detach(), lp.detach(), adv)
    loss, stats = Objective(LossConfig(weights={"rl": 1.0, "ce": 0.5})).loss(x, weights, Counts({"rl": 4, "ce": 2}, {"rl": 2, "ce": 1}))
    # rl: -(0.5 - 1.0) / 4 = 0.125 ; ce: 3.0 / 2 = 1.5, times 0.5 -> 0.75
    assert loss.item() == pytest.approx(0.125 + 0.75)
    assert stats["loss/rl"].item() == pytest.approx(0.125) and stats["loss/ce"].item() == pytest.approx(1.5)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-0.125, 0.25, -0.25])


def test_unknown_channel_is_an_error():
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="unknown loss channel 'distil'"):
        Objective(LossConfig()).loss(LossInputs(lp, lp, lp, lp), {"distil": torch.ones(1, 2)}, Counts({"distil": 2}, {}))


def test_token_logprobs_apply_temperature():
    logits = torch.tensor([[[2.0, 0.0]]])
    want = 4.0 - math.log(math.exp(4.0) + 1.0)
    assert token_logprobs(logits, torch.tensor([[0]]), 0.5).item() == pytest.approx(want, rel=1e-5)

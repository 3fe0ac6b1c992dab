import math

import pytest
import torch

from composer_prime.config.models import LossConfig, RLLossConfig
from composer_prime.trainer.loss import total_loss
from composer_prime.trainer.loss.ce import token_logprobs
from composer_prime.trainer.loss.rl import rl_loss

CFG = RLLossConfig(eps_low=0.2, eps_high=0.28, is_cap=2.0)


def grad_of(logp: float, old: float, mu: float, adv: float) -> tuple[float, float]:
    lp = torch.tensor([logp], requires_grad=True)
    loss, _ = rl_loss(lp, torch.tensor([old]), torch.tensor([mu]), torch.tensor([adv]), torch.tensor([1.0]), CFG)
    loss.backward()
    return loss.item(), lp.grad.item()


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_on_policy_gradient_is_minus_advantage(adv):
    loss, grad = grad_of(-1.0, -1.0, -1.0, adv)
    assert loss == pytest.approx(-adv) and grad == pytest.approx(-adv)


def test_clip_higher_stops_gradient_outside_the_band():
    # rho = 1.5 > 1 + 0.28 with A = +1: clipped, loss -1.28, no gradient
    loss, grad = grad_of(math.log(1.5), 0.0, 0.0, 1.0)
    assert loss == pytest.approx(-1.28) and grad == 0.0
    # rho = 0.5 < 0.8 with A = -1: clipped, loss 0.8, no gradient
    loss, grad = grad_of(math.log(0.5), 0.0, 0.0, -1.0)
    assert loss == pytest.approx(0.8) and grad == 0.0
    # rho = 1.5 with A = -1: the pessimistic (unclipped) branch, gradient +1.5
    loss, grad = grad_of(math.log(1.5), 0.0, 0.0, -1.0)
    assert loss == pytest.approx(1.5) and grad == pytest.approx(1.5)


def test_truncated_importance_weight_is_capped_and_detached():
    # pi_old / mu = 3 -> capped at 2; pi_old / mu = 0.1 -> 0.1
    _, grad = grad_of(0.0, 0.0, math.log(1 / 3), 1.0)
    assert grad == pytest.approx(-2.0)
    _, grad = grad_of(0.0, 0.0, math.log(10), 1.0)
    assert grad == pytest.approx(-0.1)


def test_channels_are_normalised_by_their_own_token_counts():
    lp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    weights = {"rl": torch.tensor([[1.0, 1.0, 0.0]]), "ce": torch.tensor([[0.0, 0.0, 1.0]])}
    adv = torch.tensor([[0.5, -1.0, 0.0]])
    loss, stats = total_loss(lp, lp.detach(), lp.detach(), adv, weights, {"rl": 4, "ce": 2},
                             LossConfig(weights={"rl": 1.0, "ce": 0.5}))
    # rl: -(0.5 - 1.0) / 4 = 0.125 ; ce: 3.0 / 2 = 1.5, times 0.5 -> 0.75
    assert loss.item() == pytest.approx(0.125 + 0.75)
    assert stats["loss/rl"].item() == pytest.approx(0.125) and stats["loss/ce"].item() == pytest.approx(1.5)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-0.125, 0.25, -0.25])


def test_token_logprobs_apply_temperature():
    logits = torch.tensor([[[2.0, 0.0]]])
    t = 0.5
    want = 4.0 - math.log(math.exp(4.0) + 1.0)
    assert token_logprobs(logits, torch.tensor([[0]]), t).item() == pytest.approx(want, rel=1e-5)

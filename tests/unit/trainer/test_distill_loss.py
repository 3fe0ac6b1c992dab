"""The distill divergence pinned to hand-computed values (DESIGN.md §3), and its gradient."""

import math

import pytest
import torch

from composer_prime.trainer.loss.distill import generalized_jsd

T = torch.tensor([0.9, 0.1]).log()  # logits whose softmax is p_T
S = torch.tensor([0.5, 0.5]).log()


@pytest.mark.parametrize("beta,expected", [(0.0, 0.368064), (1.0, 0.510826), (0.5, 0.101749)])
def test_generalized_jsd_pinned(beta, expected):
    # beta 0: KL(T||S) = 0.9 ln 1.8 + 0.1 ln 0.2; beta 1: KL(S||T) = 0.5 ln(5/9) + 0.5 ln 5;
    # beta 0.5: M = [0.7, 0.3], 0.5 KL(T||M) + 0.5 KL(S||M) = 0.5 * 0.116322 + 0.5 * 0.087177
    assert generalized_jsd(S, T, beta).item() == pytest.approx(expected, abs=1e-6)


def test_identical_distributions_give_zero_and_zero_gradient():
    logits = torch.randn(3, 7, requires_grad=True)
    loss = generalized_jsd(logits, logits.detach().clone(), 0.5).sum()
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-6) and logits.grad.abs().max().item() < 1e-6


def test_gradient_moves_the_student_toward_the_teacher_only():
    student = S.clone().requires_grad_(True)
    teacher = T.clone().requires_grad_(True)
    generalized_jsd(student, teacher, 0.0).backward()
    assert teacher.grad is None or teacher.grad.abs().sum() == 0  # the teacher is a target
    # forward KL gradient wrt student logits = p_S - p_T = [-0.4, +0.4]: raise token 0, lower token 1
    assert torch.allclose(student.grad, torch.tensor([-0.4, 0.4]), atol=1e-6)


def test_temperature_top_k_and_clamp():
    hot = generalized_jsd(S, T, 0.0, temperature=2.0).item()
    pt = torch.softmax(T / 2, -1)
    assert hot == pytest.approx(float((pt * (pt.log() - math.log(0.5))).sum()), abs=1e-6)
    s, t = torch.tensor([0.0, 0.0, 5.0]), torch.tensor([2.0, 1.0, -9.0])
    # top-2 of the teacher: tokens 0 and 1; on them the student is uniform
    pt2 = torch.softmax(torch.tensor([2.0, 1.0]), -1)
    assert generalized_jsd(s, t, 0.0, top_k=2).item() == pytest.approx(float((pt2 * (pt2.log() - math.log(0.5))).sum()), abs=1e-6)
    assert generalized_jsd(S, T, 1.0, clamp=0.2).item() == pytest.approx(0.2)
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(S, T, 1.5)


def test_sampled_estimator_pinned():
    """p_S(y) = 0.2, p_T(y) = 0.6: value ln(0.2 / 0.6) = -1.098612; d/d log p_S(y) = the same gap,
    so with respect to the student's logits the gradient is gap * (onehot(y) - p_S)."""
    from composer_prime.trainer.loss.distill import sampled_reverse_kl

    student = torch.tensor([[0.2, 0.8]]).log().requires_grad_(True)
    teacher = torch.tensor([[0.6, 0.4]]).log().requires_grad_(True)
    y = torch.tensor([0])
    value = sampled_reverse_kl(student, teacher, y)
    value.sum().backward()
    gap = math.log(1 / 3)
    assert value.item() == pytest.approx(gap, abs=1e-6)
    # descent raises the written token, which the teacher likes more than the student does
    assert torch.allclose(student.grad, torch.tensor([[gap * 0.8, -gap * 0.8]]), atol=1e-6)
    assert student.grad[0, 0] < 0 and (teacher.grad is None or teacher.grad.abs().sum() == 0)
    clamped = torch.tensor([[0.2, 0.8]]).log().requires_grad_(True)
    sampled_reverse_kl(clamped, teacher, y, clamp=0.5).sum().backward()
    assert torch.allclose(clamped.grad, torch.tensor([[-0.4, 0.4]]), atol=1e-6)  # the gap capped at -0.5


def test_sampled_estimator_is_zero_where_teacher_and_student_agree_on_the_token():
    from composer_prime.trainer.loss.distill import sampled_reverse_kl

    student = torch.tensor([[0.3, 0.3, 0.4]]).log().requires_grad_(True)
    teacher = torch.tensor([[0.3, 0.6, 0.1]]).log()  # other tokens differ: only the written one counts
    value = sampled_reverse_kl(student, teacher, torch.tensor([0]))
    value.sum().backward()
    assert value.item() == pytest.approx(0.0, abs=1e-6) and student.grad.abs().max().item() < 1e-6


def test_up_to_first_miss_keeps_each_error_turn_until_the_teachers_first_disagreement():
    from composer_prime.trainer.loss.distill import up_to_first_miss

    miss = torch.tensor([0, 1, 0, 1, 0, 0, 0, 1, 1, 0, 0, 1], dtype=torch.bool)
    turns = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3])
    assert up_to_first_miss(miss, turns).tolist() == [1, 1, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1]

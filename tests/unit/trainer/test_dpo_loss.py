"""The `dpo` channel: the loss pinned by hand, and the channel's split computation (pairs scored
at the step's start, each row carrying its half of the gradient) equal to autograd of the real
DPO objective on a real model, with the pair's rows in different micro-batches."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from composer_prime.config.models import LossConfig
from composer_prime.contract.batches import Batch, Sample, SchemaError
from composer_prime.trainer.data import collate
from composer_prime.trainer.loss import Context, Counts, LossInputs, Objective, token_logprobs
from composer_prime.trainer.loss.dpo import dpo_loss

BETA = 0.1


def test_policy_equal_to_reference_gives_ln2():
    t = torch.tensor
    assert dpo_loss(t(-7.0), t(-9.0), t(-7.0), t(-9.0), BETA).item() == pytest.approx(math.log(2), abs=1e-6)  # 0.693147


def test_hand_computed_pair_and_its_gradient_signs():
    pi_w, pi_l = torch.tensor(-10.0, requires_grad=True), torch.tensor(-12.0, requires_grad=True)
    loss = dpo_loss(pi_w, pi_l, torch.tensor(-11.0), torch.tensor(-11.0), BETA)  # margin (1) - (-1) = 2
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-0.2)), abs=1e-6)  # 0.598139
    loss.backward()
    sig = 1 / (1 + math.exp(0.2))  # sigma(-beta * margin) = 0.450166
    assert pi_w.grad.item() == pytest.approx(-BETA * sig, abs=1e-6) and pi_w.grad.item() < 0  # raise the chosen
    assert pi_l.grad.item() == pytest.approx(BETA * sig, abs=1e-6) and pi_l.grad.item() > 0  # lower the rejected


def row(prompt: list[int], response: list[int], pair: str, chosen: bool, ref: float, weight: float = 1.0) -> Sample:
    ids = prompt + response
    w = [0.0] * len(prompt) + [weight] * len(response)
    n = len(ids)
    return Sample(ids, [0.0] * n, [0.0] * n, {"dpo": w}, channel_data={"dpo": {"pair": pair, "chosen": chosen,
                                                                                         "ref_logp": ref}})


PAIRS = [  # prompt, chosen, rejected, reference log-probs (fixed numbers: the dataset's, not the policy's)
    ([5, 9, 13], [40, 41, 42], [60, 61], -9.5, -6.0),
    ([7, 8], [50, 51], [30, 31, 32, 33], -7.0, -12.5),  # rejected sorts first: shared rows reorder the pair
]


def batch_of(weights: list[float]) -> Batch:
    samples = []
    for i, ((prompt, yw, yl, rw, rl), w) in enumerate(zip(PAIRS, weights)):
        samples += [row(prompt, yw, f"p{i}", True, rw, w), row(prompt, yl, f"p{i}", False, rl, w)]
    return Batch(step=0, samples=samples)


def channel_loss_and_grads(model, batch: Batch, share_cap: int | None = None) -> tuple[float, list[torch.Tensor]]:
    """The trainer's path: begin, then one micro-batch per row (a pair's rows apart), objective.loss each.
    `share_cap`: the pairs are scored at the step's start in shared-prefix rows (a pair shares its prompt)."""
    objective = Objective(LossConfig.model_validate({"weights": {"rl": 0.0, "dpo": 1.0}}),
                          Context(model, "unused", 0, share_cap))
    objective.check(batch)
    counts = Counts.of(batch)
    active = objective.active(counts)
    for ch in active:
        ch.begin(batch)
    model.zero_grad()
    total = 0.0
    for s in batch.samples:
        mb = collate([s], 0, sorted(counts.tokens), "cpu")
        lp = token_logprobs(model(input_ids=mb.input_ids).logits[:, :-1], mb.input_ids[:, 1:], mb.temperature)
        x = LossInputs(lp, lp.detach(), mb.sampling_logprobs, mb.advantages)
        loss, _ = objective.loss(x, mb.channel_weights, counts, {ch.name: ch.prepare(mb, x) for ch in active})
        loss.backward()
        total += loss.item()
    return total, [p.grad.clone() for p in model.parameters()]


def direct_loss_and_grads(model, pairs: list[int]) -> tuple[float, list[torch.Tensor]]:
    """Autograd of mean_pairs DPO(sequence log-probs) on one forward per row."""
    model.zero_grad()

    def seq(prompt, response):
        ids = torch.tensor([prompt + response])
        lp = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:])
        return lp[0, len(prompt) - 1:].sum()

    losses = [dpo_loss(seq(p, yw), seq(p, yl), torch.tensor(rw), torch.tensor(rl), BETA)
              for p, yw, yl, rw, rl in (PAIRS[i] for i in pairs)]
    loss = torch.stack(losses).mean()
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


@pytest.mark.parametrize("share_cap", [None, 64])
def test_channel_gradient_is_the_dpo_gradient(model, share_cap):
    got, g_channel = channel_loss_and_grads(model, batch_of([1.0, 1.0]), share_cap)
    want, g_direct = direct_loss_and_grads(model, [0, 1])
    assert got == pytest.approx(want, rel=1e-5)
    for a, b in zip(g_channel, g_direct):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in g_channel)


def test_a_zero_weight_pair_contributes_nothing(model):
    got, g_with = channel_loss_and_grads(model, batch_of([1.0, 0.0]))
    want, g_alone = direct_loss_and_grads(model, [0])
    assert got == pytest.approx(want, rel=1e-5)
    for a, b in zip(g_with, g_alone):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_bad_pairs_are_refused_on_arrival(model):
    objective = Objective(LossConfig.model_validate({"weights": {"dpo": 1.0}}), Context(model, "unused", 0))
    lonely = batch_of([1.0, 1.0])
    lonely.samples.pop()
    with pytest.raises(SchemaError, match="pair p1: needs one chosen and one rejected"):
        objective.check(lonely)
    dummy = batch_of([1.0])
    dummy.samples[0].channel_data["dpo"]["ref_logp"] = float("nan")
    with pytest.raises(SchemaError, match="ref_logp must be a finite log-prob"):
        objective.check(dummy)


def test_a_pairs_loss_and_gradient_scale_with_its_weight(model):
    """What the replay step's decay acts through: weight w gives w times the loss and the gradient."""
    full, g_full = channel_loss_and_grads(model, batch_of([1.0, 1.0]))
    scaled, g_scaled = channel_loss_and_grads(model, batch_of([0.4, 0.4]))
    assert scaled == pytest.approx(0.4 * full, rel=1e-5) and full > 0
    for a, b in zip(g_scaled, g_full):
        torch.testing.assert_close(a, 0.4 * b, rtol=1e-4, atol=1e-7)

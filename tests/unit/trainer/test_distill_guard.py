"""The distill channel's collapse guard (`trainer.loss.distill.guard`): the flat-batch collapse of
benchmarks/README.md#distill_ab reproduced without it, gone with it, and its rule pinned.

The collapse: a batch whose groups are all flat (every advantage 0) carries only the distill
gradient, and Adam's first step is lr * g / (|g| + eps), about lr * sign(g) whatever g's scale, so
the channel's weight does not shrink the step. With `guard = "failed"` a token's distill weight is
kept only where its advantage is negative: the flat batch moves no weight at all.
"""

import math

import pytest
import torch

from composer_prime.config.models import LossConfig
from composer_prime.contract.batches import Batch
from composer_prime.orchestrator.teachers import history_before, teacher_view
from composer_prime.trainer.data import collate
from composer_prime.trainer.loss import Counts, LossInputs, Objective, token_logprobs
from composer_prime.trainer.loss.distill import DistillChannel, DistillLossConfig
from composer_prime.trainer.loss.distill_teacher import TeacherTargets
from composer_prime.trainer.model import load_model
from tests.unit.trainer.test_distill_channel import HINT, RIGHT, WRONG, conversation, sample_with, targets_of

LR = 1e-3


@pytest.fixture(scope="module")
def flat_batch(tiny_model_dir):
    """One tool-calc rollout whose first turn erred, in a flat group: rl weight on its tokens, advantage 0."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    q = "12 + 34"
    ids, turns, opening = conversation(tok, q, [WRONG % q, RIGHT % q])
    t = teacher_view(tok, ids, turns[0].start, turns[0].end, history_before(opening, turns, 0), HINT)
    return [sample_with(ids, [t], rl=True, advantage=0.0)]


def adam_step(model_dir, samples, weight: float, guard: str) -> tuple[float, float]:
    """(loss, norm of the weight update) of one Adam step from the initial weights on `samples`."""
    torch.manual_seed(0)
    model = load_model(str(model_dir))
    before = [p.detach().clone() for p in model.parameters()]
    cfg = LossConfig(weights={"rl": 1.0, "distill": weight}, distill={"guard": guard, "teacher": "frozen"})
    batch = Batch(0, samples)
    mb = collate(samples, 0, sorted(batch.channel_token_counts()))
    logits = model(input_ids=mb.input_ids).logits[:, :-1]
    lp = token_logprobs(logits, mb.input_ids[:, 1:])
    with torch.no_grad():
        teacher = targets_of(load_model(str(model_dir)), mb, logits.detach(), teacher_is_student=False)
    objective = Objective(cfg)
    loss, _ = objective.loss(LossInputs(lp, lp.detach(), mb.sampling_logprobs, mb.advantages, logits),
                             mb.channel_weights, Counts.of(batch), {"distill": teacher})
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    loss.backward()
    opt.step()
    delta = math.sqrt(sum(((p.detach() - b) ** 2).sum().item() for p, b in zip(model.parameters(), before)))
    return loss.item(), delta


def test_without_the_guard_a_flat_batch_takes_a_full_step_whatever_the_weight(tiny_model_dir, flat_batch):
    """The collapse's mechanism, reproduced: a 100x smaller distill weight still moves the weights
    by (nearly) the same amount, since the batch carries nothing else."""
    loss_1, step_1 = adam_step(tiny_model_dir, flat_batch, 1.0, "none")
    loss_small, step_small = adam_step(tiny_model_dir, flat_batch, 0.01, "none")
    assert loss_1 > 0 and loss_small == pytest.approx(loss_1 / 100, rel=1e-4)
    assert step_1 > 10 * LR  # many parameters each moved by about lr
    assert step_small > 0.9 * step_1


@pytest.mark.parametrize("weight", [1.0, 0.01])
def test_with_the_guard_a_flat_batch_moves_no_weight(tiny_model_dir, flat_batch, weight):
    loss, step = adam_step(tiny_model_dir, flat_batch, weight, "failed")
    assert loss == 0.0 and step == 0.0


def test_the_guard_keeps_distill_only_where_the_advantage_is_negative():
    """Two tokens, each with p_T = [0.9, 0.1] and p_S = [0.5, 0.5] (JSD at beta 0.5 = 0.101749, the
    worked number of docs/algorithms.md); the first in a failed sample (A = -1), the second in one
    that succeeded (A = +1) and one in a flat group (A = 0)."""
    teacher = TeacherTargets(rows=torch.tensor([0, 0, 0]), cols=torch.tensor([0, 1, 2]),
                             scores=torch.tensor([[0.9, 0.1]] * 3).log(), tokens=torch.tensor([0, 0, 0]),
                             segments=torch.tensor([0, 0, 0]))
    logits = torch.zeros(1, 3, 2, requires_grad=True)  # p_S = [0.5, 0.5]
    lp = torch.zeros(1, 3)
    x = LossInputs(lp, lp, lp, torch.tensor([[-1.0, 1.0, 0.0]]), logits)
    w = torch.ones(1, 3)
    kept, _ = DistillChannel(DistillLossConfig(guard="failed")).loss(x, w, teacher)
    every, _ = DistillChannel(DistillLossConfig(guard="none")).loss(x, w, teacher)
    assert kept.item() == pytest.approx(0.101749, abs=1e-6)
    assert every.item() == pytest.approx(3 * 0.101749, abs=1e-5)

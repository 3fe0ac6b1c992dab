"""The distill channel's collapse guard (`trainer.loss.distill.guard`): the flat-batch collapse of
benchmarks/README.md#distill_ab reproduced without it, gone with it, and its rule pinned.

The collapse: a batch whose groups are all flat (every advantage 0) carries only the distill
gradient, and Adam's first step is lr * g / (|g| + eps), about lr * sign(g) whatever g's scale, so
the channel's weight does not shrink the step. With `guard = "failed"` a token's distill weight is
kept only where its advantage is negative: the flat batch moves no weight at all. The credit estimator
(RLSD) makes it impossible by construction: the teacher only scales rl's advantage, token by token,
within 1 +- credit_clip, so a flat batch has no gradient under any guard and a failed turn's update
keeps rl's sign and at most 1 + credit_clip of its size.
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


def objective_on(model, model_dir, samples, weights: dict, **distill) -> tuple[torch.Tensor, torch.Tensor, object]:
    """(total loss, the policy's token log-probs, the micro-batch) of `samples` under `weights`, the
    teacher scored by a second copy of the initial weights (the "frozen" teacher)."""
    batch = Batch(0, samples)
    mb = collate(samples, 0, sorted(batch.channel_token_counts()))
    logits = model(input_ids=mb.input_ids).logits[:, :-1]
    lp = token_logprobs(logits, mb.input_ids[:, 1:])
    lp.retain_grad()
    with torch.no_grad():
        teacher = targets_of(load_model(str(model_dir)), mb, logits.detach(), teacher_is_student=False)
    objective = Objective(LossConfig(weights=weights, distill={"teacher": "frozen", **distill}))
    # sampled by this very policy (mu = pi_old = pi): rl's off-policy weight is 1
    loss, _ = objective.loss(LossInputs(lp, lp.detach(), lp.detach(), mb.advantages, logits),
                             mb.channel_weights, Counts.of(batch), {"distill": teacher})
    return loss, lp, mb


def adam_step(model_dir, samples, weight: float, guard: str, estimator: str = "jsd") -> tuple[float, float]:
    """(loss, norm of the weight update) of one Adam step from the initial weights on `samples`."""
    torch.manual_seed(0)
    model = load_model(str(model_dir))
    before = [p.detach().clone() for p in model.parameters()]
    loss, _, _ = objective_on(model, model_dir, samples, {"rl": 1.0, "distill": weight}, guard=guard, estimator=estimator)
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


@pytest.mark.parametrize("guard", ["none", "failed"])
def test_credit_moves_no_weight_on_a_flat_batch_under_any_guard(tiny_model_dir, flat_batch, guard):
    """The batch that collapses the JSD channel without its guard (above): the credit term is A * (c - 1) * rho,
    0 where A is 0, so no step at all, with the guard off too."""
    loss, step = adam_step(tiny_model_dir, flat_batch, 1.0, guard, "credit")
    assert loss == 0.0 and step == 0.0


def test_credit_keeps_rls_sign_and_bounds_its_size_on_every_token(tiny_model_dir):
    """A failed rollout (A = -1) whose first turn erred, the hinted frozen teacher scoring it: with the credit
    term the gradient on each token's log-prob is rl's times c_t in [1 - eps, 1 + eps] on the error turn
    (some tokens blamed more, some less: the teacher does say something) and nothing where rl has nothing."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    q = "12 + 34"
    ids, turns, opening = conversation(tok, q, [WRONG % q, RIGHT % q])
    t = teacher_view(tok, ids, turns[0].start, turns[0].end, history_before(opening, turns, 0), HINT)
    samples = [sample_with(ids, [t], rl=True, advantage=-1.0)]
    grads = {}
    for name, weights in {"rl": {"rl": 1.0, "distill": 0.0}, "rl+credit": {"rl": 1.0, "distill": 1.0}}.items():
        torch.manual_seed(0)
        loss, lp, mb = objective_on(load_model(str(tiny_model_dir)), tiny_model_dir, samples, weights,
                                    estimator="credit", credit_clip=0.5)
        loss.backward()
        grads[name] = lp.grad[0]
    on_turn = mb.channel_weights["distill"][0] > 0
    ratio = grads["rl+credit"] / grads["rl"].where(grads["rl"] != 0, torch.ones(()))
    assert on_turn.sum() == turns[0].end - turns[0].start and (grads["rl"][on_turn] > 0).all()  # A < 0: pushed down
    assert ((ratio[on_turn] >= 0.5 - 1e-6) & (ratio[on_turn] <= 1.5 + 1e-6)).all(), ratio[on_turn]
    assert ratio[on_turn].max() > 1.01 and ratio[on_turn].min() < 0.99
    assert (grads["rl"][~on_turn] == 0).all() and (grads["rl+credit"][~on_turn] == 0).all()


def test_credit_pinned_on_hand_computed_tokens():
    """eps = 0.5. A failed token the teacher dislikes (p_T(y) = 0.1, p_S(y) = 0.5): c = exp(-log(0.1 / 0.5)) = 5,
    clipped to 1.5, loss -(-1)(0.5) = 0.5; one it likes (p_T(y) = 0.9): c = exp(-log 1.8) = 0.5556, loss -0.4444;
    a successful token it likes: c = 1.8 clipped to 1.5, loss -0.5; a flat one: 0. Divided by rl's 8 tokens."""
    teacher = TeacherTargets(rows=torch.zeros(4, dtype=torch.long), cols=torch.arange(4),
                             scores=torch.tensor([[0.1, 0.9], [0.9, 0.1], [0.9, 0.1], [0.9, 0.1]]).log(),
                             tokens=torch.zeros(4, dtype=torch.long), segments=torch.zeros(4, dtype=torch.long))
    logits = torch.zeros(1, 4, 2)  # p_S = [0.5, 0.5]
    lp = torch.full((1, 4), math.log(0.5), requires_grad=True)
    x = LossInputs(lp, lp.detach(), lp.detach(), torch.tensor([[-1.0, -1.0, 1.0, 0.0]]), logits)
    ch = DistillChannel(DistillLossConfig(estimator="credit", credit_clip=0.5, guard="none"))
    loss, _ = ch.loss(x, torch.ones(1, 4), teacher)
    assert loss.item() == pytest.approx(0.5 - 0.4444444 - 0.5, abs=1e-6)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([0.5, -0.4444444, -0.5, 0.0], abs=1e-6)
    assert ch.denominator(Counts({"rl": 8, "distill": 4}, {"rl": 2, "distill": 1})) == 8


def test_credit_centred_moves_no_blame_for_a_shift_of_the_whole_turn():
    """Five tokens of a failed sample (A = -1, rho = 1, so loss_t = c_t - 1), the student uniform over two tokens.
    Turn 1: the hint lifts every token alike, the teacher's logit for y up by 0.3, gap log p_T(y) - log p_S(y) =
    log(2 e^0.3 / (e^0.3 + 1)) = 0.1388 each: uncentred each blame drops to c = exp(-0.1388) = 0.8704; centred
    nothing moves (c = 1). Turn 2, centred apart: logits -1 and +1 give gaps -0.6201 and +0.3799 (mean -0.1201),
    centred -0.5 and +0.5: c = exp(0.5) = 1.6487 clipped to 1.5, and exp(-0.5) = 0.6065."""
    scores = torch.tensor([[0.3, 0.0]] * 3 + [[-1.0, 0.0], [1.0, 0.0]])
    teacher = TeacherTargets(rows=torch.zeros(5, dtype=torch.long), cols=torch.arange(5), scores=scores,
                             tokens=torch.zeros(5, dtype=torch.long), segments=torch.tensor([0, 0, 0, 1, 1]))
    lp = torch.zeros(1, 5)
    x = LossInputs(lp, lp, lp, -torch.ones(1, 5), torch.zeros(1, 5, 2))

    def c(center: bool) -> list[float]:
        ch = DistillChannel(DistillLossConfig(estimator="credit", credit_center=center))
        return [1 + ch.loss(x, torch.eye(5)[i][None], teacher)[0].item() for i in range(5)]

    assert c(True) == pytest.approx([1.0, 1.0, 1.0, 1.5, 0.6065], abs=1e-4)
    assert c(False) == pytest.approx([0.8704] * 3 + [1.5, 0.6839], abs=1e-4)  # turn 2 uncentred: exp(-0.3799)

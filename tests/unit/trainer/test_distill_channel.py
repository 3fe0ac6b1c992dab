"""The distill channel inside the trainer: teacher contexts spliced from the student's ids, the
alignment of teacher and student positions, the trainer-side teacher forward, the top-k teacher
from inference, and an empty hint giving exactly zero loss and gradient."""

from dataclasses import asdict

import pytest
import torch
from transformers import AutoTokenizer

from composer_prime.config.models import LossConfig
from composer_prime.contract.batches import Batch, SchemaError, Sample, decode, encode
from composer_prime.contract.distill import Teacher
from composer_prime.env_runtime.turns import Turn, tool_message
from composer_prime.orchestrator.teachers import history_before, teacher_view
from composer_prime.trainer.data import collate
from composer_prime.trainer.loss import Counts, LossInputs, Objective, token_logprobs
from composer_prime.trainer.model import load_model
from composer_prime.trainer.loss.distill import DistillChannel, DistillLossConfig
from composer_prime.trainer.loss.distill_teacher import teacher_targets
from composer_prime.utils.chat import continuation_ids, encode_chat

SYSTEM = 'Use calc: <tool_call>{"name": "calc", "arguments": {"expr": "12 * 34"}}</tool_call> then reply with the result.'
WRONG = '<tool_call>{"name": "calculator", "arguments": {"expr": "%s"}}</tool_call>'
RIGHT = '<tool_call>{"name": "calc", "arguments": {"expr": "%s"}}</tool_call>'
HINT = "The tool is called `calc`, not `calculator`."


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    torch.manual_seed(0)
    return load_model(str(tiny_model_dir))


def conversation(tok, question: str, replies: list[str]) -> tuple[list[int], list[Turn], list[dict]]:
    """Student ids built the way rollouts are (encode_chat, then appended turns and tool replies),
    each turn but the last answered by a tool error."""
    opening = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    ids, history, turns = encode_chat(tok, opening), list(opening), []
    for k, reply in enumerate(replies):
        start = len(ids)
        ids += tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]
        turns.append(Turn(reply, "stop", start, len(ids), result={"content": "unknown tool", "is_error": True, "done": False}))
        if k < len(replies) - 1:
            msg = tool_message(turns[-1].result)
            ids += continuation_ids(tok, history, reply, [msg])
            history += [{"role": "assistant", "content": reply}, msg]
    return ids, turns, opening


def sample_with(ids: list[int], teachers: list[Teacher], rl: bool = False, advantage: float = -1.0) -> Sample:
    """A sample distilling `teachers`' turns; its advantage there is `advantage` (by default a failed
    sample's: the collapse guard distills nothing where it is not negative, test_distill_guard.py)."""
    distill = [0.0] * len(ids)
    for t in teachers:
        distill[t.student_start: t.student_start + t.length] = [1.0] * t.length
    weights = {"distill": distill} | ({"rl": [float(w > 0) for w in distill]} if rl else {})
    return checked(Sample(ids, [0.0] * len(ids), [advantage * (w > 0) for w in distill], weights,
                          channel_data={"distill": [asdict(t) for t in teachers]}))


def checked(sample: Sample) -> Sample:
    """What the trainer does on arrival: the distill channel parses and checks its data."""
    DistillChannel(DistillLossConfig()).check(sample)
    return sample


def targets_of(model, mb, logits, teacher_is_student: bool = True):
    items = [(row, t) for row, views in mb.channel_data["distill"] for t in views]
    return teacher_targets(model, mb.input_ids, items, logits, 0, forward=True, teacher_is_student=teacher_is_student)


def distill_loss_of(model, samples: list[Sample], cfg: LossConfig | None = None):
    cfg = cfg or LossConfig(weights={"distill": 1.0})
    batch = Batch(0, samples)
    mb = collate(samples, 0, sorted(batch.channel_token_counts()))
    logits = model(input_ids=mb.input_ids).logits[:, :-1]
    logits.retain_grad()
    lp = token_logprobs(logits, mb.input_ids[:, 1:])
    teacher = targets_of(model, mb, logits)
    counts = Counts(batch.channel_token_counts(), batch.channel_sequence_counts())
    loss, stats = Objective(cfg).loss(LossInputs(lp, lp.detach(), mb.sampling_logprobs, mb.advantages, logits),
                                      mb.channel_weights, counts, {"distill": teacher})
    loss.backward()
    return loss, stats, logits, teacher


@pytest.mark.parametrize("question,error_turn", [("12 + 34", 0), ("512 * 907 and then subtract the first operand", 1)])
def test_teacher_positions_hold_the_students_tokens(tok, model, question, error_turn):
    ids, turns, opening = conversation(tok, question, [WRONG % question, WRONG % question, RIGHT % question][: error_turn + 2])
    turn = turns[error_turn]
    history = history_before(opening, turns, error_turn)
    t = teacher_view(tok, ids, turn.start, turn.end, history, HINT)
    # the splice is exactly the template's rendering of the hinted context, then the turn's own ids
    assert t.input_ids[: t.start] == encode_chat(tok, history + [{"role": "user", "content": HINT}])
    assert t.start > t.student_start and t.length == turn.end - turn.start
    for j in range(t.length):
        assert t.input_ids[t.start + j] == ids[t.student_start + j]
    # in the trainer, row i of the targets is the teacher's distribution for the same token the student predicts there
    s = sample_with(ids, [t])
    mb = collate([s], 0, ["distill"])
    logits = model(input_ids=mb.input_ids).logits[:, :-1].detach()
    targets = targets_of(model, mb, logits)
    direct = model(input_ids=torch.tensor([t.input_ids])).logits[0].detach()
    for i, (r, c) in enumerate(zip(targets.rows.tolist(), targets.cols.tolist())):
        token = mb.input_ids[r, c + 1].item()  # shifted column c predicts token c + 1
        assert token == t.input_ids[t.start + i]
        torch.testing.assert_close(targets.scores[i], direct[t.start - 1 + i], rtol=1e-5, atol=1e-5)
    assert targets.rows.tolist() == [0] * t.length


@pytest.mark.parametrize("estimator", ["jsd", "sampled"])
def test_empty_hint_gives_exactly_zero_loss_and_gradient(tok, model, estimator):
    ids, turns, opening = conversation(tok, "12 + 34", [WRONG % "12 + 34", RIGHT % "12 + 34"])
    t = teacher_view(tok, ids, turns[1].start, turns[1].end, history_before(opening, turns, 1), "")
    assert t.input_ids == ids[: turns[1].end] and t.start == t.student_start
    cfg = LossConfig(weights={"distill": 1.0}, distill={"estimator": estimator})
    loss, stats, logits, _ = distill_loss_of(model, [sample_with(ids, [t])], cfg)
    assert loss.item() == 0.0 and stats["loss/distill"].item() == 0.0
    assert logits.grad.abs().max().item() == 0.0


@pytest.mark.parametrize("estimator", ["jsd", "sampled"])
def test_a_hint_pulls_only_the_error_turn(tok, model, estimator):
    ids, turns, opening = conversation(tok, "12 + 34", [WRONG % "12 + 34", RIGHT % "12 + 34"])
    t = teacher_view(tok, ids, turns[0].start, turns[0].end, history_before(opening, turns, 0), HINT)
    cfg = LossConfig(weights={"distill": 1.0}, distill={"estimator": estimator})
    loss, stats, logits, targets = distill_loss_of(model, [sample_with(ids, [t])], cfg)
    assert abs(loss.item()) > 1e-4 and torch.isfinite(loss)
    if estimator == "sampled":  # the value is the mean gap log p_S(y) - log p_T(y) over the turn
        s = torch.log_softmax(logits.detach()[targets.rows, targets.cols], -1)
        t_ = torch.log_softmax(targets.scores, -1)
        y = targets.tokens[:, None]
        assert loss.item() == pytest.approx((s.gather(-1, y) - t_.gather(-1, y)).mean().item(), rel=1e-5)
    touched = (logits.grad[0].abs().sum(-1) > 0).nonzero().flatten().tolist()
    assert touched == list(range(t.student_start - 1, t.student_start - 1 + t.length))  # the error turn's tokens, nothing else
    assert 0.0 <= stats["distill/top1_agree"].item() <= 1.0


def test_top_k_teacher_from_inference_matches_top_k_on_full_logits(tok, model):
    ids, turns, opening = conversation(tok, "12 + 34", [WRONG % "12 + 34", RIGHT % "12 + 34"])
    t = teacher_view(tok, ids, turns[0].start, turns[0].end, history_before(opening, turns, 0), HINT)
    k = 8
    direct = torch.log_softmax(model(input_ids=torch.tensor([t.input_ids])).logits[0, t.start - 1: t.start - 1 + t.length].detach(), -1)
    top = direct.topk(k, -1)
    scored = Teacher(t.input_ids, t.start, t.student_start, t.length, top.indices.tolist(), top.values.tolist())
    full, _, _, _ = distill_loss_of(model, [sample_with(ids, [t])], LossConfig(weights={"distill": 1.0}, distill={"top_k": k}))
    from_top, _, _, targets = distill_loss_of(model, [sample_with(ids, [scored])])
    assert targets.support is not None and targets.scores.shape == (t.length, k)
    assert from_top.item() == pytest.approx(full.item(), rel=1e-5)
    with pytest.raises(ValueError, match="full teacher logits"):
        distill_loss_of(model, [sample_with(ids, [scored])], LossConfig(weights={"distill": 1.0}, distill={"estimator": "sampled"}))


def test_teachers_survive_the_wire_and_bad_ones_are_refused(tok):
    ids, turns, opening = conversation(tok, "12 + 34", [WRONG % "12 + 34", RIGHT % "12 + 34"])
    t = teacher_view(tok, ids, turns[0].start, turns[0].end, history_before(opening, turns, 0), HINT)
    sent = sample_with(ids, [t])
    sent.channel_data["distill"] = [asdict(v) for v in sent.channel_data["distill"]]
    back = checked(decode(encode(Batch(3, [sent]))).samples[0])
    assert back.channel_data["distill"] == [t]
    shifted = Teacher(t.input_ids, t.start + 1, t.student_start, t.length)  # off by one: another token
    with pytest.raises(SchemaError, match="not the student's"):
        sample_with(ids, [shifted])
    with pytest.raises(SchemaError, match="without a teacher"):
        checked(Sample(ids, [0.0] * len(ids), [0.0] * len(ids), {"distill": [1.0] * len(ids)}, channel_data={"distill": [asdict(t)]}))


def test_a_frozen_teacher_is_scored_by_its_own_weights(tok, model, tiny_model_dir):
    ids, turns, opening = conversation(tok, "12 + 34", [WRONG % "12 + 34", RIGHT % "12 + 34"])
    hinted = teacher_view(tok, ids, turns[1].start, turns[1].end, history_before(opening, turns, 1), HINT)
    plain = teacher_view(tok, ids, turns[0].start, turns[0].end, history_before(opening, turns, 0), "")
    frozen = load_model(str(tiny_model_dir))
    with torch.no_grad():
        for p in frozen.parameters():
            p.add_(0.01 * torch.randn_like(p))  # other weights than the student's
    mb = collate([sample_with(ids, [plain, hinted])], 0, ["distill"])
    logits = model(input_ids=mb.input_ids).logits[:, :-1].detach()
    targets = targets_of(frozen, mb, logits, teacher_is_student=False)
    # not reused even for the empty hint: the teacher is another model
    want = [frozen(input_ids=torch.tensor([t.input_ids])).logits[0, t.start - 1: t.start - 1 + t.length].detach()
            for t in (plain, hinted)]
    torch.testing.assert_close(targets.scores, torch.cat(want), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(targets.scores[: plain.length], logits[0, plain.student_start - 1: plain.student_start - 1 + plain.length])


def test_first_miss_scope_stops_at_the_teachers_first_disagreement(tok, model):
    ids, turns, opening = conversation(tok, "12 + 34", [WRONG % "12 + 34", RIGHT % "12 + 34"])
    t = teacher_view(tok, ids, turns[0].start, turns[0].end, history_before(opening, turns, 0), HINT)
    cfg = LossConfig(weights={"distill": 1.0}, distill={"scope": "first_miss"})
    _, stats, logits, targets = distill_loss_of(model, [sample_with(ids, [t])], cfg)
    top = targets.scores.argmax(-1)
    first = int((top != targets.tokens).nonzero()[0])  # the untrained tiny model disagrees somewhere
    touched = (logits.grad[0].abs().sum(-1) > 0).nonzero().flatten().tolist()
    assert touched == list(range(t.student_start - 1, t.student_start + first))  # through the first miss, no further
    assert stats["distill/kept"].item() == pytest.approx((first + 1) / t.length)

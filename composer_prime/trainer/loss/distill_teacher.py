"""Teacher distributions for the `distill` channel (hint self-distillation at error turns).

The teacher is the policy itself with a hint in its context. By default the trainer computes it:
one no-grad forward over each teacher context (the student's context with the hint inserted,
ending with the error turn's own token ids). Why here rather than on the inference server: the
trainer holds exactly the weights being optimised (no staleness between teacher and student),
sees the whole vocabulary rather than a top-k, and needs no extra network round trip; the cost
is a forward over contexts that stop at the error turn. The other way is supported too: the
orchestrator (`distill.teacher = "inference"`) asks the inference server for the prefill's
top-k log-probs and ships them in `Teacher.top_ids/top_logprobs` (the view's type is the
contract's: composer_prime/contract/distill.py); those are used as they are.

Which weights score it (`trainer.loss.distill.teacher`): the current policy, the frozen initial
one, or an exponential moving average of the policy. With the current policy the teacher moves
with every step, so if the student drifts into a degenerate output the teacher drifts with it
and stops pulling back; the average lags by about 1/rate steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from composer_prime.contract.distill import Teacher


@dataclass
class TeacherTargets:
    """The teacher's distributions at the distill tokens of one micro-batch: student position
    (rows[i], cols[i]) in the shifted [B, T-1] layout is matched to `scores[i]`, logits over the
    vocabulary, or over `support[i]` (token ids) when the teacher gave only its top-k."""

    rows: torch.Tensor  # [N]
    cols: torch.Tensor  # [N]
    scores: torch.Tensor  # [N, V] or [N, k]
    tokens: torch.Tensor  # [N] the token the student sampled there
    segments: torch.Tensor  # [N] which error turn (teacher) each position belongs to, contiguous
    support: torch.Tensor | None = None  # [N, k]


@torch.no_grad()
def ema_update(teacher: torch.nn.Module, policy: torch.nn.Module, rate: float) -> None:
    """teacher <- teacher + rate * (policy - teacher), parameter by parameter. Both are sharded
    alike, so each rank updates its own shards and no communication is needed."""
    for m in (teacher, policy):  # FSDP2 keeps the root's parameters gathered after a forward with no backward
        if hasattr(m, "reshard"):
            m.reshard()
    for t, p in zip(teacher.parameters(), policy.parameters(), strict=True):
        t.lerp_(p, rate)


def _same_context(input_ids: torch.Tensor, row: int, t: Teacher) -> bool:
    """An empty hint: the teacher sees exactly what the student saw, so its logits are the
    student's (reused, which makes the divergence exactly 0 rather than float noise)."""
    return t.start == t.student_start and t.input_ids[: t.start + t.length] == input_ids[row, : t.start + t.length].tolist()


@torch.no_grad()
def _forward(model, seqs: list[list[int]], pad_id: int, first: int) -> torch.Tensor:
    """Logits from position `first` on (right padding: a causal model's positions never see it).
    The teacher contexts end with the error turn, so only their tails are needed: keeping just
    those bounds the [rows, positions, vocabulary] tensor for long prompts and real vocabularies."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long, device=next(model.parameters()).device)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    return model(input_ids=ids, logits_to_keep=width - first).logits


def teacher_targets(model, input_ids: torch.Tensor, items: list[tuple[int, Teacher]], student_logits: torch.Tensor,
                    pad_id: int, forward: bool, teacher_is_student: bool) -> TeacherTargets | None:
    """Teacher scores aligned to the student's distill tokens: `items` are (row, teacher view) of
    the micro-batch `input_ids`. `forward`: this step scores teachers here (a filler forward runs
    when this rank has none, to keep FSDP's collectives in step)."""
    precomputed = [bool(t.top_ids) for _, t in items]
    if any(precomputed) and not all(precomputed):
        raise ValueError("a batch mixes inference-scored and trainer-scored teachers")
    rows, cols, segments = [], [], []
    for i, (row, t) in enumerate(items):
        rows += [row] * t.length
        cols += range(t.student_start - 1, t.student_start - 1 + t.length)  # shifted: column c predicts token c + 1
        segments += [i] * t.length
    dev = input_ids.device  # the model's: every index and target lives beside the logits
    where = (torch.tensor(rows, dtype=torch.long, device=dev), torch.tensor(cols, dtype=torch.long, device=dev))
    tokens = input_ids[where[0], where[1] + 1] if items else None
    if items and all(precomputed):
        return TeacherTargets(*where, torch.tensor([lp for _, t in items for lp in t.top_logprobs], dtype=torch.float32, device=dev),
                              tokens, torch.tensor(segments, device=dev),
                              torch.tensor([ids for _, t in items for ids in t.top_ids], device=dev))
    reuse = [teacher_is_student and _same_context(input_ids, row, t) for row, t in items]
    todo = [t for (_, t), r in zip(items, reuse) if not r]
    first = min((t.start - 1 for t in todo), default=0)  # the earliest position any teacher needs
    logits = _forward(model, [t.input_ids[: t.start + t.length] for t in todo] or [[pad_id, pad_id]], pad_id, first) if forward else None
    if not items:
        return None
    scores, k = [], 0
    for (row, t), r in zip(items, reuse):
        if r:
            scores.append(student_logits[row, t.student_start - 1: t.student_start - 1 + t.length].detach())
        else:
            scores.append(logits[k, t.start - 1 - first: t.start - 1 - first + t.length])
            k += 1
    return TeacherTargets(*where, torch.cat(scores).float(), tokens, torch.tensor(segments, device=dev))

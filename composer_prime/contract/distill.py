"""The `distill` channel's data: one teacher view per hinted error turn, in
`Sample.channel_data["distill"]`.

The orchestrator builds the views (orchestrator/teachers.py splices a hint into the student's
ids; orchestrator/distill.py attaches them, with the inference server's top-k when it scores the
teacher); the trainer's channel (trainer/loss/distill.py) checks them on arrival with
`teacher_views` and scores them (trainer/loss/distill_teacher.py says who scores and why).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from composer_prime.contract.batches import Sample, SchemaError


@dataclass
class Teacher:
    """One error turn seen by the teacher: the student's context with a hint inserted, followed by
    the turn's own token ids. Teacher position `start + j` holds the same token as student
    position `student_start + j` for j < length (checked on arrival, so nothing is re-tokenised).

    Without `top_ids` the trainer scores `input_ids` itself (no-grad forward); with them the
    teacher distribution was computed elsewhere (the inference server's prefill): its top-k token
    ids and log-probs at each of the `length` positions.
    """

    input_ids: list[int]
    start: int
    student_start: int
    length: int
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)


def teacher_views(sample: Sample) -> list[Teacher]:
    """The sample's teacher views (dicts as they come off the wire, or views), checked: each covers
    the student's own tokens, top-k lists have a row per position, and every token with distill
    weight has a teacher. SchemaError otherwise."""
    n, views = len(sample.input_ids), []
    for i, t in enumerate(sample.channel_data["distill"]):
        try:
            t = t if isinstance(t, Teacher) else Teacher(**t)
        except TypeError as e:
            raise SchemaError(f"distill teachers[{i}]: {e}") from None
        if t.length < 1 or t.start < 1 or t.student_start < 1 or t.student_start + t.length > n \
                or t.input_ids[t.start: t.start + t.length] != sample.input_ids[t.student_start: t.student_start + t.length]:
            raise SchemaError(f"teachers[{i}]: its tokens {t.start}..{t.start + t.length} are not the student's "
                              f"{t.student_start}..{t.student_start + t.length}")
        if t.top_ids and not (len(t.top_ids) == len(t.top_logprobs) == t.length):
            raise SchemaError(f"teachers[{i}]: top-k lists need one row per position ({t.length})")
        views.append(t)
    covered = {j for t in views for j in range(t.student_start, t.student_start + t.length)}
    distill = {j for j, w in enumerate(sample.channel_weights.get("distill", [])) if w != 0}
    if distill - covered:  # a distill token without a teacher would train on nothing, silently
        raise SchemaError(f"distill weight on tokens without a teacher: {sorted(distill - covered)[:5]}")
    return views

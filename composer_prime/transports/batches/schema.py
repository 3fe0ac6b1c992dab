"""What the orchestrator sends the trainer: typed, versioned, msgpack on the wire.

The trainer is algorithm-blind: per token it gets the sampling log-prob, the advantage and a
weight per loss channel ("rl", "ce", "distill", later "dpo"); it never sees rewards or tasks.
All per-token lists are aligned with `input_ids` (position t describes token t). The `distill`
channel also needs, for each error turn, the teacher's view of it (`Teacher`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import msgpack

SCHEMA_VERSION = 2  # 2: Sample.teachers


class SchemaError(ValueError):
    """A message that is not a training batch of the version this build speaks."""


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


@dataclass
class Sample:
    input_ids: list[int]
    sampling_logprobs: list[float]  # mu(token) under the sampling distribution; 0 on prompt tokens
    advantages: list[float]
    channel_weights: dict[str, list[float]]  # e.g. {"rl": [0, 0, 1, 1]}; 0 = not in this channel
    temperature: float = 1.0
    policy_version: int = 0
    aux: dict[str, list[float]] = field(default_factory=dict)  # per-token extras a channel needs (reference log-probs)
    teachers: list[Teacher] = field(default_factory=list)  # the distill channel's targets, one per error turn

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        self.teachers = [t if isinstance(t, Teacher) else Teacher(**t) for t in self.teachers]
        lists = {"sampling_logprobs": self.sampling_logprobs, "advantages": self.advantages}
        lists |= {f"channel_weights.{k}": v for k, v in self.channel_weights.items()}
        lists |= {f"aux.{k}": v for k, v in self.aux.items()}
        for name, values in lists.items():
            if len(values) != n:
                raise SchemaError(f"{name} has {len(values)} entries for {n} tokens")
        covered = set()
        for i, t in enumerate(self.teachers):
            if t.length < 1 or t.start < 1 or t.student_start < 1 or t.student_start + t.length > n \
                    or t.input_ids[t.start: t.start + t.length] != self.input_ids[t.student_start: t.student_start + t.length]:
                raise SchemaError(f"teachers[{i}]: its tokens {t.start}..{t.start + t.length} are not the student's "
                                  f"{t.student_start}..{t.student_start + t.length}")
            if t.top_ids and not (len(t.top_ids) == len(t.top_logprobs) == t.length):
                raise SchemaError(f"teachers[{i}]: top-k lists need one row per position ({t.length})")
            covered |= set(range(t.student_start, t.student_start + t.length))
        distill = {j for j, w in enumerate(self.channel_weights.get("distill", [])) if w != 0}
        if distill - covered:  # a distill token without a teacher would train on nothing, silently
            raise SchemaError(f"distill weight on tokens without a teacher: {sorted(distill - covered)[:5]}")


@dataclass
class Batch:
    step: int
    samples: list[Sample]
    metrics: dict[str, float] = field(default_factory=dict)

    def channel_token_counts(self) -> dict[str, int]:
        """Tokens with non-zero weight per channel over the whole batch: each channel's normaliser."""
        counts: dict[str, int] = {}
        for s in self.samples:
            for ch, w in s.channel_weights.items():
                counts[ch] = counts.get(ch, 0) + sum(1 for x in w if x != 0)
        return counts

    def channel_sequence_counts(self) -> dict[str, int]:
        """Samples with any non-zero weight per channel: the normaliser of sequence-level objectives."""
        counts: dict[str, int] = {}
        for s in self.samples:
            for ch, w in s.channel_weights.items():
                counts[ch] = counts.get(ch, 0) + int(any(x != 0 for x in w))
        return counts


def encode(batch: Batch) -> bytes:
    return msgpack.packb({"schema": SCHEMA_VERSION, "type": "batch", **asdict(batch)}, use_bin_type=True)


def decode(payload: bytes) -> Batch:
    try:
        msg = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # noqa: BLE001 - any undecodable payload is a schema error
        raise SchemaError(f"undecodable batch message: {e}") from None
    if not isinstance(msg, dict) or msg.get("type") != "batch":
        raise SchemaError("message is not a training batch")
    if msg.get("schema") != SCHEMA_VERSION:
        raise SchemaError(f"batch schema {msg.get('schema')} but this trainer speaks {SCHEMA_VERSION}")
    try:
        samples = [Sample(**s) for s in msg["samples"]]
        return Batch(step=msg["step"], samples=samples, metrics=msg.get("metrics", {}))
    except (KeyError, TypeError) as e:
        raise SchemaError(f"malformed batch: {e}") from None

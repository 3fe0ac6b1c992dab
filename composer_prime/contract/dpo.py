"""The `dpo` channel's data: a preference pair travels as two rows (samples) of the batch.

Each row carries `channel_data["dpo"]`, a `PairRow`, and the pair's weight on its response tokens
(the same on both rows). The orchestrator builds them from a pairs dataset (orchestrator/replay.py);
the trainer's channel (trainer/loss/dpo.py) checks each row and each pair on arrival with
`check_row` and `check_pairs`.
"""

from __future__ import annotations

import math
from typing import TypedDict

from composer_prime.contract.batches import Sample, SchemaError


class PairRow(TypedDict):
    pair: str  # the pair's id, the same on its two rows
    chosen: bool  # this row is the preferred response
    ref_logp: float  # the frozen reference's log-prob of this row's response, computed when the pair was made


def pair_weight(sample: Sample) -> float:
    """The row's dpo weight (the pair's): 0 for a row without dpo tokens."""
    return max((abs(w) for w in sample.channel_weights.get("dpo", [])), default=0.0)


def check_row(sample: Sample) -> None:
    """SchemaError unless the row's data is a `PairRow` with a real log-prob and one weight."""
    d = sample.channel_data["dpo"]
    if not (isinstance(d, dict) and isinstance(d.get("pair"), str) and isinstance(d.get("chosen"), bool)):
        raise SchemaError(f"dpo data must be {{pair: str, chosen: bool, ref_logp: float}}, got {str(d)[:80]}")
    if not isinstance(d.get("ref_logp"), (int, float)) or not math.isfinite(d["ref_logp"]) or d["ref_logp"] > 0:
        raise SchemaError(f"dpo pair {d['pair']}: ref_logp must be a finite log-prob (<= 0), got {d.get('ref_logp')!r}")
    if len({w for w in sample.channel_weights.get("dpo", []) if w != 0}) > 1:
        raise SchemaError(f"dpo pair {d['pair']}: one weight per row (the pair's), got several")


def check_pairs(samples: list[Sample]) -> None:
    """SchemaError unless every pair has exactly one chosen and one rejected row, of equal weight."""
    rows: dict[str, list[tuple[bool, float]]] = {}
    for s in samples:
        if "dpo" in s.channel_data:
            rows.setdefault(s.channel_data["dpo"]["pair"], []).append((s.channel_data["dpo"]["chosen"], pair_weight(s)))
    for pid, got in rows.items():
        if sorted(c for c, _ in got) != [False, True] or got[0][1] != got[1][1]:
            raise SchemaError(f"dpo pair {pid}: needs one chosen and one rejected row of equal weight, got {got}")

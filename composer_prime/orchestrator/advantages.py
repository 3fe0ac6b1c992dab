"""Group advantages and dynamic sampling.

GRPO:     A_i = (r_i - mean(r)) / (std(r) + eps), sample (Bessel-corrected) std
Dr.GRPO:  A_i = r_i - mean(r)                      (the default: no std scaling)
Dynamic sampling (DAPO): a group whose rewards are all equal has zero advantage everywhere and
teaches nothing, so it is dropped and the batch is refilled.
"""

from __future__ import annotations

import statistics


def group_advantages(rewards: list[float], kind: str = "drgrpo", eps: float = 0.0) -> list[float]:
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if kind == "drgrpo":
        return centred
    if kind == "grpo":
        std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
        return [c / (std + eps) if std + eps > 0 else 0.0 for c in centred]
    raise ValueError(f"unknown advantage kind '{kind}' (drgrpo, grpo)")


def has_spread(rewards: list[float], tol: float = 1e-9) -> bool:
    return max(rewards) - min(rewards) > tol

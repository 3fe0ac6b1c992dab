"""Group advantages and dynamic sampling.

GRPO:     A_i = (r_i - mean(r)) / (std(r) + eps), sample (Bessel-corrected) std
Dr.GRPO:  A_i = r_i - mean(r)                      (the default: no std scaling)
Dynamic sampling (DAPO): a group whose rewards are all equal has zero advantage everywhere and
teaches nothing, so it is dropped and the batch is refilled.
Overlong shaping (DAPO), with L_max = overlong_max and L_cache = overlong_cache, added to the reward:
    0                               if |y| <= L_max - L_cache
    ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
    -1                              if |y| > L_max
Length penalty (optional): - length_penalty * |y| / max_tokens.
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


def overlong_penalty(length: int, max_len: int, cache: int) -> float:
    if length <= max_len - cache:
        return 0.0
    if length <= max_len:
        return ((max_len - cache) - length) / cache
    return -1.0


def shape_reward(reward: float, length: int, overlong_max: int, overlong_cache: int, length_penalty: float,
                 max_tokens: int) -> float:
    """The reward the advantages are computed from: task reward plus the configured length terms."""
    if overlong_max > 0:
        reward += overlong_penalty(length, overlong_max, overlong_cache)
    if length_penalty:
        reward -= length_penalty * length / max_tokens
    return reward

"""Loss channels. The trainer is algorithm-blind: per token it has the policy's log-prob, the
sampler's log-prob, an advantage, a weight per channel and optional per-token extras (`aux`:
reference log-probs); the `distill` channel also gets the student's logits and the teacher's
distributions at its tokens. Each channel returns a summed loss; `total_loss` divides it by
the channel's own count over the whole batch (all ranks), tokens or sequences as the channel
says, and sums the channels scaled by `loss.weights`.

A new channel is one function `(inputs, weights, cfg) -> (summed loss, summed stats)` and one
entry in `CHANNELS`; nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from composer_prime.config.models import LossConfig
from composer_prime.trainer.loss.ce import ce_loss, token_logprobs
from composer_prime.trainer.loss.distill import TeacherTargets, distill_loss
from composer_prime.trainer.loss.rl import rl_loss

__all__ = ["LossInputs", "Counts", "total_loss", "token_logprobs", "CHANNELS", "TeacherTargets"]


@dataclass
class LossInputs:
    """One micro-batch, every tensor [B, T-1] aligned with the predicted tokens."""

    logprobs: torch.Tensor  # pi, with grad
    old_logprobs: torch.Tensor  # pi_old: the policy before this step's update (detached)
    sampling_logprobs: torch.Tensor  # mu: what inference sampled with
    advantages: torch.Tensor
    aux: dict[str, torch.Tensor] = field(default_factory=dict)  # e.g. "ref_logprobs"
    logits: torch.Tensor | None = None  # [B, T-1, V] student logits, with grad (the distill channel)
    teacher: TeacherTargets | None = None  # the teacher's distributions at the distill tokens


@dataclass
class Counts:
    """Per channel, over the whole batch on all ranks: weighted tokens and sequences."""

    tokens: dict[str, int]
    sequences: dict[str, int]


def _rl(x: LossInputs, w: torch.Tensor, cfg: LossConfig):
    return rl_loss(x.logprobs, x.old_logprobs, x.sampling_logprobs, x.advantages, w, cfg.rl, x.aux.get("ref_logprobs"))


def _ce(x: LossInputs, w: torch.Tensor, cfg: LossConfig):
    return ce_loss(x.logprobs, w), {}


def _distill(x: LossInputs, w: torch.Tensor, cfg: LossConfig):
    if x.teacher is None or x.logits is None:
        if (w != 0).any():
            raise ValueError("distill weights without the student's logits and teacher targets")
        zero = (x.logprobs * w).sum()  # none of this micro-batch's tokens: zero, still in the graph
        return zero, {"distill/top1_agree": zero.detach(), "distill/kept": zero.detach()}  # same keys on every rank (all-reduced)
    return distill_loss(x.logits, x.teacher, w, cfg.distill)


Channel = Callable[[LossInputs, torch.Tensor, LossConfig], tuple[torch.Tensor, dict[str, torch.Tensor]]]
CHANNELS: dict[str, Channel] = {"rl": _rl, "ce": _ce, "distill": _distill}


def normaliser(channel: str, cfg: LossConfig) -> str:
    """"tokens" or "sequences": what the channel's summed loss is divided by."""
    return "sequences" if channel == "rl" and cfg.rl.norm != "token" else "tokens"


def total_loss(x: LossInputs, weights: dict[str, torch.Tensor], counts: Counts,
               cfg: LossConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    total = x.logprobs.new_zeros(())
    stats: dict[str, torch.Tensor] = {}
    for channel, w in weights.items():
        if channel not in CHANNELS:
            raise ValueError(f"unknown loss channel '{channel}' (known: {', '.join(CHANNELS)})")
        n_tokens = counts.tokens.get(channel, 0)
        scale = cfg.weights.get(channel, 1.0)
        if n_tokens == 0 or scale == 0:
            continue
        loss, extra = CHANNELS[channel](x, w, cfg)
        denom = counts.sequences.get(channel, 0) if normaliser(channel, cfg) == "sequences" else n_tokens
        stats |= {k: v / n_tokens for k, v in extra.items()}  # statistics are per token (channels name them apart)
        stats[f"loss/{channel}"] = loss.detach() / denom
        total = total + scale * loss / denom
    return total, stats

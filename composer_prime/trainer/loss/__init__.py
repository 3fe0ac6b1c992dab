"""Loss channels. Each returns a summed loss over its weighted tokens; `total_loss` divides each
channel by its own token count over the whole batch (all ranks), then sums the channels."""

from __future__ import annotations

import torch

from composer_prime.config.models import LossConfig
from composer_prime.trainer.loss.ce import ce_loss, token_logprobs
from composer_prime.trainer.loss.rl import rl_loss

__all__ = ["total_loss", "token_logprobs"]


def total_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    channel_weights: dict[str, torch.Tensor],
    token_counts: dict[str, int],
    cfg: LossConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    total = logprobs.new_zeros(())
    stats: dict[str, torch.Tensor] = {}
    for channel, weights in channel_weights.items():
        count = token_counts.get(channel, 0)
        scale = cfg.weights.get(channel, 1.0)
        if count == 0 or scale == 0:
            continue
        if channel == "rl":
            loss, extra = rl_loss(logprobs, old_logprobs, sampling_logprobs, advantages, weights, cfg.rl)
            stats |= {k: v / count for k, v in extra.items()}
        elif channel == "ce":
            loss = ce_loss(logprobs, weights)
        else:
            raise ValueError(f"unknown loss channel '{channel}' (known: rl, ce)")
        stats[f"loss/{channel}"] = loss.detach() / count
        total = total + scale * loss / count
    return total, stats

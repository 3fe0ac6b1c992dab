"""The `ce` channel: plain likelihood of the weighted tokens (the likelihood `uv run sft` and the
tiny model's warm start train, model/warm_start.py, as a channel of the RL trainer).

    L_ce = - sum_t w_t * log pi(y_t)        divided by the number of ce tokens
"""

from __future__ import annotations

import torch

from composer_prime.trainer.loss import Channel, LossInputs


def ce_loss(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood of the weighted tokens (normalised by the caller)."""
    return -(logprobs * weights).sum()


class CEChannel(Channel):
    name = "ce"

    def loss(self, x: LossInputs, w: torch.Tensor, prepared: None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return ce_loss(x.logprobs, w), {}

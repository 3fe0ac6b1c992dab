"""The `ce` channel (plain likelihood, for SFT) and the token log-prob helper every channel uses."""

from __future__ import annotations

import torch

from composer_prime.model.logprobs import token_logprobs  # noqa: F401 - every channel's helper, re-exported for them


def ce_loss(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood of the weighted tokens (normalised by the caller)."""
    return -(logprobs * weights).sum()

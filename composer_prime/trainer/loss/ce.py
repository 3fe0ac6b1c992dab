"""The `ce` channel (plain likelihood, for SFT) and the token log-prob helper every channel uses."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float | torch.Tensor = 1.0) -> torch.Tensor:
    """log p(target) under softmax(logits / temperature); logits [B,T,V], targets [B,T]."""
    logits = logits.float() / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def ce_loss(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood of the weighted tokens (normalised by the caller)."""
    return -(logprobs * weights).sum()

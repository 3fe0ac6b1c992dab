"""Token log-probs under a model's logits, in the one convention used everywhere: log-probs of
the distribution actually sampled from (logits divided by the temperature)."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float | torch.Tensor = 1.0) -> torch.Tensor:
    """log p(target) under softmax(logits / temperature); logits [B,T,V], targets [B,T]."""
    logits = logits.float() / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)

"""Batched, per-request-seeded sampling for the embedded engine.

Gumbel-max: argmax(log p + g) with g = -log(-log u), u ~ U(0,1), is an exact draw from p.
Each request owns a `torch.Generator` and draws one vector of uniforms per decoded token, so
a seed reproduces its completion whatever else shares the batch, while everything else
(temperature, top-p, stop tokens, log-probs) is one tensor op over the whole batch.
"""

from __future__ import annotations

import torch


def nucleus_mask(logp: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """True where a token lies in its row's top-p nucleus (the top token always does)."""
    sorted_lp, order = logp.sort(-1, descending=True)
    p = sorted_lp.exp()
    keep_sorted = (p.cumsum(-1) - p) < top_p[:, None]
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def sample_step(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor, gens: list[torch.Generator],
                active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row. Returns (token ids, log-probs under the tempered, untruncated distribution).

    The log-prob is that of the tempered softmax before top-p, the convention the trainer
    recomputes (top-p only decides which tokens may be drawn).
    """
    greedy = temps <= 1e-5
    logp = torch.log_softmax(logits.float() / temps.clamp(min=1e-5)[:, None], -1)
    scores = logp.masked_fill(~nucleus_mask(logp, top_p), float("-inf")) if bool((top_p < 1).any()) else logp
    u = torch.stack([torch.rand(logits.shape[-1], generator=g) if a else torch.full((logits.shape[-1],), 0.5)
                     for g, a in zip(gens, active.tolist())])
    gumbel = -torch.log(-torch.log(u.clamp(min=1e-20, max=1 - 1e-7)))
    tokens = torch.where(greedy, logp.argmax(-1), (scores + gumbel).argmax(-1))
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)

"""The `distill` channel's divergence: generalized Jensen-Shannon between teacher and student.

    M = beta * p_T + (1 - beta) * p_S
    JSD_beta(T, S) = beta * KL(p_T || M) + (1 - beta) * KL(p_S || M)

with the two ends taken as the plain KLs (GKD's convention): beta = 0 is the forward
KL(p_T || p_S) (mode-covering), beta = 1 the reverse KL(p_S || p_T) (mode-seeking). Both
distributions are softmaxes at the same temperature. With `top_k`, both are restricted to the
teacher's k most likely tokens and renormalised there; `clamp` caps each token's divergence so
one wild position cannot dominate the turn.
"""

from __future__ import annotations

import math

import torch


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dim, from log-probs; 0 log 0 counts as 0."""
    return (p_log.exp() * (p_log - q_log)).nan_to_num(0.0).sum(-1)


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float = 0.5,
                    temperature: float = 1.0, top_k: int | None = None, clamp: float | None = None) -> torch.Tensor:
    """Per-position divergence [...] from logits [..., V]; gradients flow through the student only."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    s = student_logits.float() / temperature
    t = teacher_logits.detach().float() / temperature
    if top_k is not None and top_k < t.shape[-1]:
        idx = t.topk(top_k, -1).indices
        s, t = s.gather(-1, idx), t.gather(-1, idx)
    s_log, t_log = torch.log_softmax(s, -1), torch.log_softmax(t, -1)
    if beta == 0.0:
        out = _kl(t_log, s_log)
    elif beta == 1.0:
        out = _kl(s_log, t_log)
    else:
        m_log = torch.logsumexp(torch.stack([t_log + math.log(beta), s_log + math.log(1 - beta)]), 0)
        out = beta * _kl(t_log, m_log) + (1 - beta) * _kl(s_log, m_log)
    return out.clamp(max=clamp) if clamp is not None else out

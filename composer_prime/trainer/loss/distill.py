"""The `distill` channel's divergence: generalized Jensen-Shannon between teacher and student.

    M = beta * p_T + (1 - beta) * p_S
    JSD_beta(T, S) = beta * KL(p_T || M) + (1 - beta) * KL(p_S || M)

with the two ends taken as the plain KLs (GKD's convention): beta = 0 is the forward
KL(p_T || p_S) (mode-covering), beta = 1 the reverse KL(p_S || p_T) (mode-seeking). Both
distributions are softmaxes at the same temperature. With `top_k`, both are restricted to the
teacher's k most likely tokens and renormalised there; `clamp` caps each token's divergence so
one wild position cannot dominate the turn.

The other estimator (`estimator = "sampled"`) looks only at the token y the student wrote:

    loss value = log p_S(y) - log p_T(y)          (an unbiased estimate of KL(p_S || p_T))
    gradient   = (log p_S(y) - log p_T(y)) * grad log p_S(y)

the reverse KL's score-function gradient: the teacher's verdict on each written token acts as a
per-token advantage, so a token the hinted teacher would not write is pushed down and the rest
of the distribution is left alone (on-policy distillation, as in SDPO's sampled-token loss).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from composer_prime.config.models import DistillLossConfig


@dataclass
class Teacher:
    """One error turn seen by the teacher, as the orchestrator ships it in
    `Sample.channel_data["distill"]`: the student's context with a hint inserted, followed by the
    turn's own token ids. Teacher position `start + j` holds the same token as student position
    `student_start + j` for j < length (checked on arrival, so nothing is re-tokenised).

    Without `top_ids` the trainer scores `input_ids` itself (no-grad forward); with them the
    teacher distribution was computed elsewhere (the inference server's prefill): its top-k token
    ids and log-probs at each of the `length` positions.
    """

    input_ids: list[int]
    start: int
    student_start: int
    length: int
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)


def _log_mix(x: torch.Tensor, a: float) -> torch.Tensor:
    """log(a + (1 - a) * exp(x)), written so that x = 0 gives exactly 0 (identical distributions
    give an exactly zero divergence, not float noise) and large |x| never overflows."""
    pos, neg = x.clamp(min=0), x.clamp(max=0)  # each branch sees only its own range: no inf, no NaN gradient
    return torch.where(x >= 0, pos + torch.log1p(a * torch.expm1(-pos)), torch.log1p((1 - a) * torch.expm1(neg)))


def _expect(p_log: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """E_p[values] over the last dim; 0 * inf (a zero-probability token) counts as 0."""
    return (p_log.exp() * values).nan_to_num(0.0).sum(-1)


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
        out = _expect(t_log, t_log - s_log)
    elif beta == 1.0:
        out = _expect(s_log, s_log - t_log)
    else:  # log M - log p_T = log(beta + (1 - beta) p_S / p_T), and symmetrically for p_S
        out = -beta * _expect(t_log, _log_mix(s_log - t_log, beta)) \
              - (1 - beta) * _expect(s_log, _log_mix(t_log - s_log, 1 - beta))
    return out.clamp(max=clamp) if clamp is not None else out


def sampled_reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, tokens: torch.Tensor,
                       temperature: float = 1.0, clamp: float | None = None) -> torch.Tensor:
    """Per-position log p_S(y) - log p_T(y) at the written tokens y, from logits [N, V]; its
    gradient is that gap (detached, clamped to [-clamp, clamp]) times grad log p_S(y)."""
    pick = lambda logits: torch.log_softmax(logits.float() / temperature, -1).gather(-1, tokens[:, None])[:, 0]  # noqa: E731
    s = pick(student_logits)
    gap = (s - pick(teacher_logits.detach())).detach()
    if clamp is not None:
        gap = gap.clamp(-clamp, clamp)
    surrogate = gap * s
    return surrogate - surrogate.detach() + gap  # value: the gap; gradient: gap * grad s


@dataclass
class TeacherTargets:
    """The teacher's distributions at the distill tokens of one micro-batch: student position
    (rows[i], cols[i]) in the shifted [B, T-1] layout is matched to `scores[i]`, logits over the
    vocabulary, or over `support[i]` (token ids) when the teacher gave only its top-k."""

    rows: torch.Tensor  # [N]
    cols: torch.Tensor  # [N]
    scores: torch.Tensor  # [N, V] or [N, k]
    tokens: torch.Tensor  # [N] the token the student sampled there
    segments: torch.Tensor  # [N] which error turn (teacher) each position belongs to, contiguous
    support: torch.Tensor | None = None  # [N, k]


def up_to_first_miss(miss: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
    """1 for each position of a segment up to and including its first miss, 0 after it."""
    before = torch.cumsum(miss.long(), 0) - miss.long()  # misses strictly before each position, over all segments
    start = torch.ones_like(segments, dtype=torch.bool)
    start[1:] = segments[1:] != segments[:-1]
    offset = torch.cummax(torch.where(start, before, torch.zeros_like(before)), 0).values  # misses before the segment
    return (before - offset == 0).float()


def distill_loss(student_logits: torch.Tensor, teacher: TeacherTargets, weights: torch.Tensor,
                 cfg: DistillLossConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Summed weighted divergence over the error-turn tokens (the numerator of a token mean)."""
    s = student_logits[teacher.rows, teacher.cols]
    if cfg.estimator == "sampled":
        if teacher.support is not None:
            raise ValueError("the sampled estimator needs full teacher logits; this teacher gave only its top-k")
        d = sampled_reverse_kl(s, teacher.scores, teacher.tokens, cfg.temperature, cfg.clamp)
    else:
        if teacher.support is not None:  # a top-k teacher: compare on its support, both renormalised there
            s = s.gather(-1, teacher.support)
        d = generalized_jsd(s, teacher.scores, cfg.beta, cfg.temperature, cfg.top_k, cfg.clamp)
    w = weights[teacher.rows, teacher.cols]
    with torch.no_grad():
        agree = (s.argmax(-1) == teacher.scores.argmax(-1)).float()  # student's greedy token is the teacher's
        top = teacher.scores.argmax(-1)
        top = teacher.support.gather(-1, top[:, None])[:, 0] if teacher.support is not None else top
        miss = top != teacher.tokens  # the teacher would not have written the student's token here
        if cfg.scope == "first_miss":
            w = w * up_to_first_miss(miss, teacher.segments)
    return (d * w).sum(), {"distill/top1_agree": (agree * weights[teacher.rows, teacher.cols]).sum(),
                           "distill/kept": w.sum()}

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

The third (`estimator = "credit"`, RLSD, arXiv 2604.03128) does not pull the student toward the
teacher at all: the reward sets each token's direction and the teacher only its magnitude. At an
error-turn token y with rl advantage A,

    c_t    = clip(exp(sign(A) * (log p_T(y) - log p_S(y))), 1 - eps_c, 1 + eps_c)     (detached)
    loss_t = -A * (c_t - 1) * pi(y) / pi_old(y)

(with `credit_center`, sign(A) * gap less its mean over the turn: only the teacher's ranking of
the turn's tokens, not a shift the hint gives them all), divided by the rl channel's token count
(not this channel's), so that added to rl's -A * rho the
token's advantage becomes A * c_t: a failed turn's tokens the hinted teacher would not write take
up to (1 + eps_c)x the blame, those it would write as little as (1 - eps_c)x. Its update is never
against the reward's sign, is at most eps_c of rl's on the same tokens, and is exactly 0 where A is:
the channel can never take a step of its own, so the flat-batch collapse below is impossible by
construction (tests/unit/trainer/test_distill_guard.py). It can still tilt a collapse of rl's own
making (benchmarks/README.md#distill_ab: one seed of 12 at 40 steps, as with the JSD).

The collapse guard (`guard = "failed"`, the default): a token's distill weight is kept only where
its rl advantage is negative,

    w_t <- w_t * [A_t < 0]

so the reward sets the sign (only samples that failed are pulled toward the hinted teacher), and a
batch whose groups are all flat (A = 0 everywhere) carries no distill gradient at all. Without it
(`guard = "none"`) such a batch is a pure distill step, and Adam, blind to a loss's scale, turns
it into a full-size step whatever the channel's weight: the collapse of benchmarks/README.md#distill_ab.

What arrives per sample (`channel_data["distill"]`): one `Teacher` view per hinted error turn
(its type and checks: composer_prime/contract/distill.py); distill_teacher.py scores them and
keeps the EMA teacher.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from composer_prime.config.base import FieldError, Strict
from composer_prime.contract.batches import Batch, Sample
from composer_prime.contract.distill import teacher_views
from composer_prime.trainer.loss import Channel, Context, Counts, LossInputs
from composer_prime.trainer.loss.distill_teacher import TeacherTargets, ema_update, teacher_targets

__all__ = ["DistillChannel", "DistillLossConfig"]


class DistillLossConfig(Strict):
    """`trainer.loss.distill`: hint self-distillation; formulas above."""

    estimator: Literal["jsd", "sampled", "credit"] = Field(
        "jsd", description='"jsd": the generalized JSD over whole distributions (beta, top_k apply); "sampled": the '
                           "reverse KL at the token the student wrote, log p_S - log p_T as a per-token advantage "
                           '(needs the trainer\'s teacher forward); "credit": RLSD, the teacher scales each token\'s '
                           "rl advantage within 1 +- credit_clip, the reward keeps its sign (the trainer's forward too)")
    credit_clip: float = Field(0.5, gt=0.0, le=1.0, description='"credit": eps_c, how far the teacher may scale a '
                                                                "token's advantage either way")
    credit_center: bool = Field(False, description='"credit": subtract each error turn\'s mean of sign(A) * gap before '
                                                   "the exp, so that a hint shifting every token's log-prob alike moves no "
                                                   "blame: only the teacher's ranking of the turn's tokens counts")
    beta: float = Field(0.5, ge=0.0, le=1.0, description="0: KL(teacher || student), 1: KL(student || teacher), "
                                                         "between: JSD")
    temperature: float = Field(1.0, gt=0.0, description="both distributions are softmaxes at this temperature")
    top_k: int | None = Field(None, ge=1, description="restrict both to the teacher's top-k tokens")
    clamp: float | None = Field(None, gt=0.0, description='cap on one token\'s divergence ("sampled": on '
                                                          "|log p_S - log p_T|)")
    teacher: Literal["current", "frozen", "ema"] = Field(
        "current", description="the policy being trained, the initial weights, or a slow average of the policy "
                               "(SDPO's regularised teacher: it does not follow the student into a collapse)")
    ema_rate: float = Field(0.05, gt=0.0, le=1.0, description='"ema": teacher += rate * (policy - teacher) after '
                                                              "each step")
    guard: Literal["failed", "none"] = Field(
        "failed", description='"failed": distill only tokens whose rl advantage is negative (a batch of flat groups '
                              'then has no distill gradient); "none": every error-turn token')
    scope: Literal["turn", "first_miss"] = Field(
        "turn", description='"turn": every token of the error turn; "first_miss": only up to the first token the '
                            "teacher would not have sampled")


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


def segment_centred(z: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
    """z minus the mean of z over its segment (one error turn), for contiguous segment ids 0..n-1."""
    n = int(segments.max()) + 1
    sums = z.new_zeros(n).index_add_(0, segments, z)
    counts = z.new_zeros(n).index_add_(0, segments, torch.ones_like(z))
    return z - (sums / counts)[segments]


def credit_loss(x: LossInputs, teacher: TeacherTargets, w: torch.Tensor, eps: float,
                temperature: float = 1.0, center: bool = False) -> torch.Tensor:
    """Summed -A (c - 1) rho over the error-turn tokens (RLSD, formula above); w is each token's
    distill weight. Gradients flow through the policy's log-prob only."""
    rows, cols = teacher.rows, teacher.cols
    if teacher.support is not None:
        raise ValueError("the credit estimator needs full teacher logits; this teacher gave only its top-k")
    with torch.no_grad():
        pick = lambda logits: torch.log_softmax(logits.float() / temperature, -1).gather(-1, teacher.tokens[:, None])[:, 0]  # noqa: E731
        a = x.advantages[rows, cols]
        z = torch.sign(a) * (pick(teacher.scores) - pick(x.logits[rows, cols]))
        if center and len(z):
            z = segment_centred(z, teacher.segments)
        c = z.clamp(max=math.log1p(eps)).exp().clamp(min=1 - eps)  # the exponent capped first: no inf
    rho = torch.exp(x.logprobs[rows, cols] - x.old_logprobs[rows, cols])
    return -(a * (c - 1) * rho * w[rows, cols]).sum()


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
        top = teacher.scores.argmax(-1)
        top = teacher.support.gather(-1, top[:, None])[:, 0] if teacher.support is not None else top
        miss = top != teacher.tokens  # the teacher would not have written the student's token here
        if cfg.scope == "first_miss":
            w = w * up_to_first_miss(miss, teacher.segments)
    return (d * w).sum(), agreement(s, teacher, weights[teacher.rows, teacher.cols], w)


@torch.no_grad()
def agreement(s: torch.Tensor, teacher: TeacherTargets, w: torch.Tensor, kept: torch.Tensor) -> dict[str, torch.Tensor]:
    """The channel's statistics: weighted tokens whose student greedy token is the teacher's, and the
    weight the loss kept (`s`: the student's logits at the distill positions, on the teacher's support)."""
    agree = (s.argmax(-1) == teacher.scores.argmax(-1)).float()
    return {"distill/top1_agree": (agree * w).sum(), "distill/kept": kept.sum()}


class DistillChannel(Channel):
    name = "distill"
    Config = DistillLossConfig

    def __init__(self, cfg: DistillLossConfig, ctx: Context | None = None) -> None:
        super().__init__(cfg, ctx)
        self.ema = None
        if ctx is not None and cfg.teacher == "ema":  # starts at the initial weights, then trails the policy
            self.ema = ctx.frozen_copy()
        self.scorer = None if ctx is None else {"current": lambda: ctx.policy, "frozen": ctx.frozen_initial,
                                                 "ema": lambda: self.ema}[cfg.teacher]()
        self.forward = False

    @classmethod
    def check_run(cls, cfg: DistillLossConfig, orchestrator) -> None:
        """Settings of this channel that contradict the orchestrator's side of it."""
        if orchestrator.distill.enabled and orchestrator.distill.flat_groups and cfg.guard == "failed":
            raise FieldError("guard", '"failed" trains no token of a flat group\'s distill-only sample (its advantage is 0); '
                             'set orchestrator.distill.flat_groups = false, or guard = "none"')
        if not (orchestrator.distill.enabled and orchestrator.distill.teacher == "inference"):
            return
        if cfg.estimator in ("sampled", "credit"):
            raise FieldError("estimator", f'"{cfg.estimator}" needs the teacher\'s log-prob of every written token; the '
                             'inference teacher returns only its top-k (use orchestrator.distill.teacher = "trainer")')
        if cfg.teacher != "current":
            raise FieldError("teacher", f'"{cfg.teacher}" weights live in the trainer; the inference teacher scores with '
                             'the served policy (use orchestrator.distill.teacher = "trainer")')

    def check(self, sample: Sample) -> None:
        """Parse the teacher views and check each covers the student's own tokens (the contract's check)."""
        sample.channel_data["distill"] = teacher_views(sample)

    def begin(self, batch: Batch) -> None:
        """Whether any teacher of the whole batch is scored here: the same on every rank, so every
        rank runs the same number of (FSDP-collective) teacher forwards."""
        self.forward = any(not t.top_ids for s in batch.samples for t in s.channel_data.get("distill", []))

    def prepare(self, mb, x: LossInputs) -> TeacherTargets | None:
        items = [(row, t) for row, views in mb.channel_data.get("distill", []) for t in views]
        return teacher_targets(self.scorer, mb.input_ids, items, x.logits, self.ctx.pad_id, self.forward,
                               self.scorer is self.ctx.policy)

    def loss(self, x: LossInputs, w: torch.Tensor, teacher: TeacherTargets | None):
        if self.cfg.guard == "failed":
            w = w * (x.advantages < 0)
        if teacher is None:
            if (w != 0).any():
                raise ValueError("distill weights without teacher targets")
            zero = (x.logprobs * w).sum()  # none of this micro-batch's tokens: zero, still in the graph
            return zero, {"distill/top1_agree": zero.detach(), "distill/kept": zero.detach()}  # same keys on every rank
        if self.cfg.estimator == "credit":
            w_tok = w[teacher.rows, teacher.cols]
            loss = credit_loss(x, teacher, w, self.cfg.credit_clip, self.cfg.temperature, self.cfg.credit_center)
            return loss, agreement(x.logits[teacher.rows, teacher.cols], teacher, w_tok, w_tok)
        return distill_loss(x.logits, teacher, w, self.cfg)

    def denominator(self, counts: Counts) -> int:
        """"credit" shares rl's denominator, so its term is at most credit_clip of rl's on a token."""
        if self.cfg.estimator == "credit" and counts.tokens.get("rl", 0) > 0:
            return counts.tokens["rl"]
        return super().denominator(counts)

    def after_step(self) -> None:
        if self.ema is not None:
            ema_update(self.ema, self.ctx.policy, self.cfg.ema_rate)

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"EMA teacher": self.ema} if self.ema is not None else {}

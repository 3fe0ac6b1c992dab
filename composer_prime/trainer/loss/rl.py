"""The `rl` channel: clipped policy gradient with off-policy correction (the GRPO/DAPO family).

Per token, with mu the sampler's log-prob (inference), pi_old the policy at the start of this
step (detached) and pi the policy being optimised, A the token's advantage:

    rho    = pi / pi_old                                              PPO ratio (1 at the first update)
    surr   = min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)    clip-higher (DAPO)
    surr   = max(surr, delta * A)          if A < 0 and two_sided_delta = delta   (INTELLECT-2)
    w      = off-policy weight of the token, detached, from r = pi_old / mu:
               "tis"  : min(r, is_cap)                      truncated importance sampling (default)
               "mask" : 1 if mask_low <= r <= mask_high else 0   ratio-band masking
               "none" : 1
    loss_t = -w * surr + kl_coef * k3(pi, pi_ref),   k3 = exp(ref - lp) - (ref - lp) - 1

Normalisation (`norm`), over the whole batch on all ranks:
    "token"    (DAPO, default): sum_t loss_t / (number of rl tokens)
    "sequence" (GRPO)         : sum_i [sum_t loss_t / |o_i|] / (number of rl sequences)
    "constant" (Dr.GRPO)      : sum_t loss_t / (number of rl sequences * norm_constant)

`rl_loss` returns the numerator; `Objective.loss` divides by the matching count. The k3 term's
reference log-probs come from the frozen initial policy, scored by the trainer per micro-batch.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from composer_prime.config.base import Strict
from composer_prime.trainer.loss import Channel, Context, LossInputs, token_logprobs


class RLLossConfig(Strict):
    """`trainer.loss.rl`; formulas above and in docs/algorithms.md."""

    eps_low: float = Field(0.2, ge=0.0, lt=1.0, description="lower clip: ratios below 1 - eps_low stop pushing")
    eps_high: float = Field(0.28, ge=0.0, description="upper clip, DAPO clip-higher: 1 + eps_high")
    norm: Literal["token", "sequence", "constant"] = Field(
        "token", description="DAPO token mean | GRPO sequence mean | Dr.GRPO constant")
    norm_constant: int = Field(128, ge=1, description='tokens per sequence for norm = "constant" (the generation budget)')
    off_policy: Literal["tis", "mask", "none"] = Field("tis", description="correction against the sampler's log-probs")
    is_cap: float = Field(2.0, gt=0.0, description="tis: min(pi_old/mu, is_cap), detached")
    mask_low: float = Field(0.5, ge=0.0, description="mask: keep tokens with mask_low <= pi_old/mu <= mask_high")
    mask_high: float = Field(2.0, gt=0.0, description="mask: the band's upper end")
    two_sided_delta: float | None = Field(None, gt=1.0, description="INTELLECT-2 two-sided clip for A < 0 (e.g. 4.0); "
                                                                    "off by default")
    kl_coef: float = Field(0.0, ge=0.0, description="k3 KL to the frozen initial policy; 0 = no reference model")


def off_policy_weight(old_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, cfg: RLLossConfig) -> torch.Tensor:
    r = torch.exp(old_logprobs - sampling_logprobs).detach()
    if cfg.off_policy == "tis":
        return r.clamp(max=cfg.is_cap)
    if cfg.off_policy == "mask":
        return ((r >= cfg.mask_low) & (r <= cfg.mask_high)).to(r.dtype)
    return torch.ones_like(r)


def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) on tokens sampled from pi: unbiased, always >= 0."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1


def rl_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    cfg: RLLossConfig,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Summed rl loss (numerator of the chosen normalisation) and summed per-token statistics."""
    mask = weights != 0
    ratio = torch.exp(logprobs - old_logprobs)
    low, high = 1 - cfg.eps_low, 1 + cfg.eps_high
    surr = torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)
    if cfg.two_sided_delta is not None:
        surr = torch.where(advantages < 0, torch.maximum(surr, cfg.two_sided_delta * advantages), surr)
    per_token = -off_policy_weight(old_logprobs, sampling_logprobs, cfg) * surr
    if cfg.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("rl.kl_coef > 0 needs reference log-probs (the trainer computes them)")
        per_token = per_token + cfg.kl_coef * k3(logprobs, ref_logprobs)
    per_token = per_token * weights
    if cfg.norm == "token":
        loss = per_token.sum()
    elif cfg.norm == "sequence":
        loss = (per_token.sum(-1) / mask.sum(-1).clamp(min=1)).sum()
    else:  # "constant"
        loss = per_token.sum() / cfg.norm_constant
    with torch.no_grad():
        log_r = sampling_logprobs - old_logprobs  # log(mu / pi_old)
        r = torch.exp(-log_r)
        clipped = ((ratio < low) & (advantages < 0)) | ((ratio > high) & (advantages > 0))
        stats = {
            "mismatch_kl": ((torch.exp(log_r) - 1 - log_r) * mask).sum(),  # k3 estimate of KL(pi_old || mu)
            "is_truncated": ((r > cfg.is_cap) & mask).sum().float() if cfg.off_policy == "tis" else r.new_zeros(()),
            "masked": ((off_policy_weight(old_logprobs, sampling_logprobs, cfg) == 0) & mask).sum().float(),
            "clipped": (clipped & mask).sum().float(),
        }
        if cfg.kl_coef > 0:
            stats["ref_kl"] = (k3(logprobs, ref_logprobs) * mask).sum()
    return loss, stats


class RLChannel(Channel):
    name = "rl"
    Config = RLLossConfig

    def __init__(self, cfg: RLLossConfig, ctx: Context | None = None) -> None:
        super().__init__(cfg, ctx)
        self.ref = ctx.frozen_initial() if ctx is not None and cfg.kl_coef > 0 else None

    def normaliser(self) -> Literal["tokens", "sequences"]:
        return "tokens" if self.cfg.norm == "token" else "sequences"

    @torch.no_grad()
    def prepare(self, mb, x: LossInputs) -> torch.Tensor | None:
        if self.ref is None:
            return None
        return token_logprobs(mb.logits(self.ref), mb.input_ids[:, 1:], mb.temperature)

    def loss(self, x: LossInputs, w: torch.Tensor, ref_logprobs: torch.Tensor | None):
        return rl_loss(x.logprobs, x.old_logprobs, x.sampling_logprobs, x.advantages, w, self.cfg, ref_logprobs)

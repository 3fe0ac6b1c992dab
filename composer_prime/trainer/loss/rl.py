"""The `rl` channel: clipped policy gradient with truncated importance sampling (off-policy fix).

Per token, with mu the sampler's log-prob (inference), pi_old the policy at the start of this
step (detached) and pi the policy being optimised:

    rho  = pi / pi_old                                   (PPO ratio; 1 at the first update)
    w    = min(pi_old / mu, C), detached                 (truncated IS: the batch was sampled by mu)
    loss = -w * min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)      (DAPO clip-higher)

Returns the summed per-token loss (times channel weight); the caller divides by the channel's
token count over the whole batch.
"""

from __future__ import annotations

import torch

from composer_prime.config.models import RLLossConfig


def rl_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    cfg: RLLossConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    mask = weights != 0
    ratio = torch.exp(logprobs - old_logprobs)
    is_weight = torch.exp(old_logprobs - sampling_logprobs).clamp(max=cfg.is_cap).detach()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high) * advantages
    per_token = -is_weight * torch.minimum(unclipped, clipped)
    loss = (per_token * weights).sum()
    with torch.no_grad():
        log_r = sampling_logprobs - old_logprobs  # log(mu / pi_old)
        stats = {
            "mismatch_kl": ((torch.exp(log_r) - 1 - log_r) * mask).sum(),  # k3 estimate of KL(pi_old || mu)
            "is_truncated": ((torch.exp(old_logprobs - sampling_logprobs) > cfg.is_cap) & mask).sum().float(),
        }
    return loss, stats

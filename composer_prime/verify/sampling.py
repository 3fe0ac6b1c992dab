"""Did the node sample what the trusted model says it sampled? Checks over the trusted prefill's
logits at the completion's positions (no generation: one forward pass).

- **Log-probs**: the node's claimed sampling log-prob of each token must equal the trusted one,
  log softmax(z / T)[token], within `logprob_tol` (the trainer's importance ratios use them).
- **Replay**: the embedded engine draws token i of a request with seed s by inverse CDF at the
  uniform u(s, i) (model/sampling.py), a pure function of the seed and the index.
  Over the trusted logits, u must fall in (or, since two machines' logits differ by float noise,
  within `replay_margin` of) each claimed token's CDF interval: `draw_distance`, as a fraction of
  the distribution's mass. A token the node picked rather than drew, or drew at another seed or
  temperature, lies far from u (a distance of order its own probability mass or more).
- **Statistics**, for a sampler no one can replay (vLLM's: a submission's `sampler` "any"): with q_i
  the distribution token i was drawn from (logits / T, within the top-p nucleus) and x_i the token,

      p-value_i   = sum_y q_i(y) [q_i(y) <= q_i(x_i)]           (the mass at most as likely as x_i)
      min_pvalue  = n * min_i p-value_i                        (Bonferroni over the n tokens)
      surprisal_z = sum_i (s_i - H_i) / sqrt(sum_i V_i),  s_i = -log q_i(x_i), H_i = E[s_i], V_i = Var[s_i]

  Honest draws give p-values uniform on [0, 1] (so min_pvalue < a with probability at most a) and
  a z of mean 0 and variance 1. A token no draw would plausibly give has a tiny p-value; tokens
  picked rather than drawn (the likeliest, a lower temperature) are less surprising than draws:
  z far below 0. A plausible token put in place of the drawn one is not caught: only the replay
  can (docs/volunteers.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from composer_prime.config.sampling import SamplingParams
from composer_prime.model.sampling import draw_distance, nucleus_mask, sample, stream_keys


@dataclass(frozen=True)
class SamplingCheck:
    logprob_max_err: float  # max |claimed - trusted| over the completion's tokens
    replay_mismatches: int  # tokens the seeded replay draws differently
    max_draw_distance: float  # the farthest a claimed token's CDF interval is from its uniform draw
    tokens: int
    min_pvalue: float = 1.0  # n x the smallest p-value (capped at 1): for samplers no one can replay
    surprisal_z: float = 0.0
    logprobs: list[float] = field(default_factory=list)  # the trusted ones: an accepted rollout trains on these


def statistics(logits: torch.Tensor, tokens: torch.Tensor, params: SamplingParams) -> tuple[float, float]:
    """(min_pvalue, surprisal_z) of `tokens` as draws from `logits` (above); float64 throughout."""
    z = logits.double() / max(params.temperature, 1e-5)
    q = torch.softmax(z, -1)
    if params.top_p < 1:  # the nucleus a draw came from (the claimed token always in it: noise at its edge)
        keep = nucleus_mask(q, torch.full((len(q),), params.top_p)).scatter(-1, tokens[:, None], True)
        q = torch.where(keep, q, 0.0)
        q = q / q.sum(-1, keepdim=True)
    qx = q.gather(-1, tokens[:, None])
    pvalues = (q * (q <= qx)).sum(-1).clamp(max=1.0)
    logq = torch.where(q > 0, q.log(), 0.0)
    entropy = -(q * logq).sum(-1)
    var = (q * logq**2).sum(-1) - entropy**2
    s = -qx.squeeze(-1).log()
    zscore = (s - entropy).sum() / var.sum().clamp(min=1e-12).sqrt()
    return float(min(1.0, len(tokens) * pvalues.min().item())), float(zscore)


def check(logits: torch.Tensor, tokens: list[int], claimed: list[float], params: SamplingParams, seed: int) -> SamplingCheck:
    """`logits` [N, V]: the trusted logits predicting each of the N completion tokens."""
    n = len(tokens)
    z = logits.float()
    temps, top_p, keys, counters = (torch.full((n,), params.temperature), torch.full((n,), params.top_p),
                                    stream_keys([seed] * n), torch.arange(n))
    ids = torch.tensor(tokens)
    drawn, _ = sample(z, temps, top_p, keys, counters, params.top_p < 1)
    far = draw_distance(z, temps, top_p, keys, counters, ids)
    trusted = torch.log_softmax(z / max(params.temperature, 1e-5), -1).gather(-1, ids[:, None]).squeeze(-1)
    # float64: a claimed log-prob past float32's range (-3.4028236e38 passes the door as a finite float) would
    # round to -inf there, the error to inf, and the answer's JSON to null, which the validator could not read
    err = (trusted.double() - torch.tensor(claimed, dtype=torch.float64)).abs().max().item() if n else 0.0
    pmin, zscore = statistics(logits, ids, params) if n else (1.0, 0.0)
    return SamplingCheck(float(err), int((drawn != ids).sum()), float(far.max()) if n else 0.0, n, pmin, zscore,
                         trusted.tolist())

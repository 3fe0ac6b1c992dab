"""Did the node sample what the trusted model says it sampled? Two checks over the trusted prefill's
logits at the completion's positions (no generation: one forward pass).

- **Log-probs**: the node's claimed sampling log-prob of each token must equal the trusted one,
  log softmax(z / T)[token], within `logprob_tol` (the trainer's importance ratios use them).
- **Replay**: the embedded engine draws token i of a request with seed s by inverse CDF at the
  uniform u(s, i) (model/sampling.py), a pure function of the seed and the index.
  Over the trusted logits, u must fall in (or, since two machines' logits differ by float noise,
  within `replay_margin` of) each claimed token's CDF interval: `draw_distance`, as a fraction of
  the distribution's mass. A token the node picked rather than drew, or drew at another seed or
  temperature, lies far from u (a distance of order its own probability mass or more).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from composer_prime.config.sampling import SamplingParams
from composer_prime.model.sampling import draw_distance, sample, stream_keys


@dataclass(frozen=True)
class SamplingCheck:
    logprob_max_err: float  # max |claimed - trusted| over the completion's tokens
    replay_mismatches: int  # tokens the seeded replay draws differently
    max_draw_distance: float  # the farthest a claimed token's CDF interval is from its uniform draw
    tokens: int


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
    err = (trusted - torch.tensor(claimed)).abs().max().item() if n else 0.0
    return SamplingCheck(float(err), int((drawn != ids).sum()), float(far.max()) if n else 0.0, n)

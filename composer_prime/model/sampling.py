"""Batched sampling with per-request seeds, in tensor ops only, so a CUDA graph can hold it: the
embedded engine's sampler (inference/engines/hf/), and the replay a validator checks a volunteer's
draws with (verify/sampling.py).

Each row draws by inverse CDF with one uniform number, and that number is a hash (splitmix64)
of the request's seed and the index of the token being drawn, not a draw from a generator's
stream: a seed reproduces its completion whatever else shares the batch, whichever device
decodes it, and no per-request generator call (one kernel launch per row per token) is needed.
The cumulative sum is taken in float64 so that even a token of probability 1e-12 keeps its share.
Everything else (temperature, top-p, greedy rows, log-probs) is one op over the whole batch.
"""

from __future__ import annotations

import torch

GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment (2^64 / golden ratio)
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def int64(x: int) -> int:
    """The signed 64-bit integer with the low 64 bits of `x` (any Python int: a seed may be huge or negative)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic on negative values)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    # int64 products wrap modulo 2^64 in torch, on the CPU as on CUDA: splitmix64's arithmetic
    z = (z ^ _shr(z, 30)) * int64(MIX1)
    z = (z ^ _shr(z, 27)) * int64(MIX2)
    return z ^ _shr(z, 31)


def stream_keys(seeds: list[int]) -> torch.Tensor:
    """Each request's key: its seed (any Python int) mixed once, when it is admitted, not at every token."""
    return _mix(torch.tensor([int64(s) for s in seeds], dtype=torch.long) + int64(GOLDEN))


def uniforms(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One float64 in [0, 1) per row (53 random bits), a function of (key, counter) alone."""
    return _shr(_mix(keys + counters * int64(GOLDEN)), 11).double() * 2.0**-53


def nucleus_mask(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """True where a token lies in its row's top-p nucleus (the top token always does); `probs` may be
    unnormalised (a row's exp(logit - max)). Of the tokens tied at the nucleus's edge (frequent with
    bfloat16 logits) the lowest ids are kept: the sort is stable, since an unstable one orders ties as
    its kernel does, which differs between the CPU and CUDA (and is not by id even on the CPU), and
    a replay on another device would then keep other tokens."""
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    sorted_p = sorted_p / sorted_p.sum(-1, keepdim=True)
    keep_sorted = (sorted_p.cumsum(-1) - sorted_p) < top_p[:, None]
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def sample(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor, keys: torch.Tensor, counters: torch.Tensor,
           use_top_p: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row (row i's `counters[i]`-th draw of its stream `keys[i]`). Returns (token ids,
    log-probs under the tempered, untruncated distribution).

    The log-prob is that of the tempered softmax before top-p, the convention the trainer
    recomputes (top-p only decides which tokens may be drawn). `use_top_p` is the caller's
    knowledge that some row has top_p < 1 (read from the host, never from a tensor: no sync);
    rows with top_p = 1 are unaffected by it either way. Few passes over the rows x vocabulary
    logits: on a GPU at a large batch they are what this costs.
    """
    z, top, best, probs, total, cdf = _cdf(logits, temps, top_p, use_top_p)
    x = uniforms(keys, counters) * cdf[:, -1]
    drawn = torch.searchsorted(cdf, x[:, None], right=True).squeeze(1).clamp(max=logits.shape[-1] - 1)
    # float rounding at the very top of the CDF could land past the last allowed token: take the mode then
    drawn = torch.where(probs.gather(-1, drawn[:, None]).squeeze(1) > 0, drawn, best)
    tokens = torch.where(temps <= 1e-5, best, drawn)
    return tokens, z.gather(-1, tokens[:, None]).squeeze(-1) - top - total.log()


def _cdf(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor, use_top_p: bool):
    """(tempered logits z, their max, its index, unnormalised kept probabilities, their untruncated
    sum, the kept probabilities' float64 CDF): what a draw reads."""
    z = logits.float() / temps.clamp(min=1e-5)[:, None]
    top, best = z.max(-1)
    probs = (z - top[:, None]).exp()  # unnormalised: the mode at 1
    total = probs.sum(-1)
    if use_top_p:  # rows at top_p 1 keep every token: float rounding in the mask cannot touch them
        probs = probs * (nucleus_mask(probs, top_p) | (top_p >= 1)[:, None])
    return z, top, best, probs, total, probs.cumsum(-1, dtype=torch.float64)


def draw_distance(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor, keys: torch.Tensor,
                  counters: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """How far each row's draw u (as `sample` makes it) lies from `tokens`' CDF interval, as a fraction
    of the row's kept mass: 0 when `sample` over these logits would draw that token. A token drawn
    on another machine, whose logits differ by float noise, is at most that noise away; a token
    not drawn by this seed and distribution is usually far (a validator's replay, verify/sampling.py)."""
    _, _, _, probs, _, cdf = _cdf(logits, temps, top_p, bool((top_p < 1).any()))
    mass = cdf[:, -1]
    hi = cdf.gather(-1, tokens[:, None]).squeeze(-1)
    lo = hi - probs.gather(-1, tokens[:, None]).squeeze(-1).double()
    x = uniforms(keys, counters) * mass
    return (torch.clamp(lo - x, min=0) + torch.clamp(x - hi, min=0)) / mass

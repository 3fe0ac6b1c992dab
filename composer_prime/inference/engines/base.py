"""The contract every inference engine meets; the HTTP routes in `inference/server.py` sit on it.

An engine turns prompt token ids into completion token ids plus one log-prob per completion
token, scores a given sequence (top-k of the next-token distribution at each position: how a
teacher's distribution reaches the trainer), and can swap its weights for a newer step
without restarting. Log-probs follow one
convention everywhere in composer-prime: they are log-probs of the distribution actually
sampled from (logits divided by the temperature), so the trainer can recompute them exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from composer_prime.config.sampling import SamplingParams


@dataclass
class Generation:
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # one per completion token, under the sampling distribution
    finish_reason: str  # "stop" | "length"
    weight_version: int = 0  # stamped by the server: the version in force when the request came


@dataclass
class Scores:
    """The next-token distribution at positions j in [start, len): the one predicting token_ids[j]."""

    token_logprobs: list[float]  # log-prob of the actual token_ids[j]
    top_ids: list[list[int]]  # k per position, by log-prob descending
    top_logprobs: list[list[float]]
    weight_version: int = 0


def check_score_args(token_ids: list[int], start: int, top_k: int, temperature: float, max_model_len: int) -> None:
    """Raise ValueError for a request no engine can score, before any engine work."""
    if not 1 <= start < len(token_ids):
        raise ValueError(f"start must be in [1, {len(token_ids)}) for {len(token_ids)} token ids, got {start}")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to score, got {temperature}")
    if len(token_ids) > max_model_len:
        raise ValueError(f"{len(token_ids)} token ids exceed max_model_len {max_model_len}")


class Engine(Protocol):
    model_name: str
    max_model_len: int

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Generation: ...

    async def score(self, token_ids: list[int], start: int, top_k: int, temperature: float = 1.0) -> Scores:
        """Log-probs (of logits / temperature) at positions [start, len); ValueError on bad arguments."""
        ...

    async def load_weights(self, path: str) -> None:
        """Load a step directory (config.json + model.safetensors) in place, or raise."""
        ...

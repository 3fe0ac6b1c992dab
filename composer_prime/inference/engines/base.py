"""The contract every inference engine meets; the HTTP routes in `inference/server.py` sit on it.

An engine turns prompt token ids into completion token ids plus one log-prob per completion
token, scores a given sequence (top-k of the next-token distribution at each position: how a
teacher's distribution reaches the trainer), and can swap its weights for a newer step
without restarting. What it answers (`Generation`, `Scores`) is the contract's
(composer_prime/contract/inference.py), as is the log-prob convention.
"""

from __future__ import annotations

from typing import Protocol

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Generation, Scores


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

"""The contract every inference engine meets; the HTTP routes in `inference/server.py` sit on it.

An engine turns prompt token ids into completion token ids plus one log-prob per completion
token, and can swap its weights for a newer step without restarting. Log-probs follow one
convention everywhere in composer-prime: they are log-probs of the distribution actually
sampled from (logits divided by the temperature), so the trainer can recompute them exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class Generation:
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # one per completion token, under the sampling distribution
    finish_reason: str  # "stop" | "length"
    weight_version: int = 0
    extra: dict = field(default_factory=dict)


class Engine(Protocol):
    model_name: str
    max_model_len: int

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Generation: ...

    async def load_weights(self, path: str) -> None:
        """Load a step directory (config.json + model.safetensors) in place, or raise."""
        ...

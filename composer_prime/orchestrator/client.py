"""Async client for the inference server's token and score routes, spread over several servers."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from composer_prime.config.sampling import SamplingParams
from composer_prime.inference.engines.base import Scores


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_version: int


class InferenceClient:
    def __init__(self, urls: list[str], model: str, timeout_s: float = 300.0) -> None:
        self.urls, self.model = urls, model
        self._next = itertools.cycle(urls)
        self._http = httpx.AsyncClient(timeout=timeout_s)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        url = next(self._next)
        r = await self._http.post(f"{url}/inference/v1/generate",
                                  json={"model": self.model, "token_ids": prompt_ids, "sampling_params": sampling.model_dump(mode="json")})
        r.raise_for_status()
        body = r.json()
        choice = body["choices"][0]
        return Completion(choice["token_ids"], [c["logprob"] for c in choice["logprobs"]["content"]],
                          choice["finish_reason"], int(body.get("weight_version", r.headers.get("X-Weight-Version", 0))))

    async def score(self, token_ids: list[int], start: int, top_k: int, temperature: float = 1.0) -> Scores:
        """Top-k next-token log-probs at each position from `start` on (see `Engine.score`)."""
        r = await self._http.post(f"{next(self._next)}/inference/v1/score",
                                  json={"token_ids": token_ids, "start": start, "top_k": top_k, "temperature": temperature})
        r.raise_for_status()
        return Scores(**r.json())

    async def versions(self) -> list[int]:
        out = []
        for url in self.urls:
            r = await self._http.get(f"{url}/health")
            r.raise_for_status()
            out.append(int(r.json()["weight_version"]))
        return out

    async def wait_ready(self, timeout_s: float = 900.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            try:
                await self.versions()
                return
            except (httpx.HTTPError, OSError):
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError(f"inference at {self.urls} not ready after {timeout_s:.0f}s") from None
                await asyncio.sleep(1.0)

    async def wait_version(self, minimum: int, timeout_s: float = 1800.0,
                           interrupt: Callable[[], bool] = lambda: False) -> int | None:
        """Block until every server serves at least `minimum`; returns the oldest served version, or
        None as soon as `interrupt()` is true (the version may never come: e.g. the trainer restarted)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            oldest = min(await self.versions())
            if oldest >= minimum:
                return oldest
            if interrupt():
                return None
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"inference still at weights v{oldest}, needed v{minimum}: is the trainer alive?")
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        await self._http.aclose()

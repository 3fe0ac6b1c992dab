"""The engines a worker generates with, each giving a completion and the last hidden states its
TOPLOC proofs commit to (`generate_with_states`), and naming its sampler (contract/volunteer.py).

- `hf` (default): the embedded engine keeps each token's state while decoding (no second
  forward) and draws with the seeded sampler the validator replays exactly.
- `vllm`: vLLM generates (faster on a GPU), drawing with the run's seeded sampler through a
  logits processor (vllm_draws.py: the validator replays its draws), or with `draws = "engine"`
  with vLLM's own sampler (nobody can replay it: the validator tests the draws statistically,
  verify/sampling.py); then one prefill of prompt + completion on the embedded engine gives the
  states and the log-probs, as the validator's own prefill does: the worker holds the model twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import torch

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Generation
from composer_prime.inference.engines.hf.engine import HFEngine
from composer_prime.utils.net import free_port

log = logging.getLogger(__name__)


class VLLMWithPrefill:
    def __init__(self, model_dir: str, model_name: str, max_model_len: int, device: str, dtype: str,
                 seeded: bool = True) -> None:
        from composer_prime.inference.engines.vllm import VLLMEngine

        self.sampler = "seeded" if seeded else "any"
        self.prefill = HFEngine(model_dir, model_name, max_model_len=max_model_len, max_batch=1, device=device, dtype=dtype)
        self.dtype = self.prefill.dtype  # resolved ("auto": the device's); vLLM computes in the same one
        extra = ["--logits-processors", "composer_prime.volunteer.vllm_draws:SeededDraws"] if seeded else []
        self.vllm = VLLMEngine(model_dir, model_name, free_port(), max_model_len=max_model_len, dtype=self.dtype,
                               extra_args=extra)
        self._thread = None  # both started: as the embedded engine says it

    async def start(self) -> None:
        await self.prefill.start()
        await self.vllm.start()
        self._thread = self.prefill._thread
        log.info(f"vLLM generates on port {self.vllm.port}; the embedded engine prefills for the proofs")

    async def stop(self) -> None:
        await asyncio.gather(self.vllm.stop(), self.prefill.stop())

    async def load_weights(self, path: str) -> None:
        await asyncio.gather(self.vllm.load_weights(path), self.prefill.load_weights(path))

    async def generate_with_states(self, prompt_ids: list[int], params: SamplingParams) -> tuple[Generation, torch.Tensor]:
        gen = await self.vllm.generate(prompt_ids, params)
        hidden, logits = await self.prefill.states(prompt_ids + gen.token_ids, len(prompt_ids))
        # the log-probs are the prefill's, in the contract's convention (log softmax(z / T), before top-p): with
        # the seeded draws vLLM saw a one-hot, and its own at top-p < 1 are renormalised over the nucleus
        z = torch.log_softmax(logits / max(params.temperature, 1e-5), -1)
        return dataclasses.replace(gen, logprobs=z.gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1).tolist()), hidden


def make_engine(kind: str, model_dir: str, model_name: str, max_model_len: int, concurrency: int, device: str,
                dtype: str, draws: str = "seeded"):
    """The worker's engine of `kind` (hf or vllm), not started."""
    if kind == "vllm":
        return VLLMWithPrefill(model_dir, model_name, max_model_len, device, dtype, seeded=draws == "seeded")
    return HFEngine(model_dir, model_name, max_model_len=max_model_len, max_batch=concurrency,  # a row per lease loop
                    device=device, dtype=dtype, keep_states=True)

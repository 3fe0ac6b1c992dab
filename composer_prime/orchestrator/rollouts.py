"""One rollout and one group: render the prompt, generate through the token route, score."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import verifiers.v1 as vf
from transformers import PreTrainedTokenizerBase

from composer_prime.config.models import SamplingConfig
from composer_prime.orchestrator.client import Completion, InferenceClient
from composer_prime.orchestrator.envs import messages, score
from composer_prime.transports.batches.schema import Sample
from composer_prime.utils.chat import encode_chat


@dataclass
class Rollout:
    task: vf.Task
    prompt_ids: list[int]
    completion: Completion
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)

    def to_sample(self, advantage: float, temperature: float, seq_len: int) -> Sample:
        p, c = len(self.prompt_ids), len(self.completion.token_ids)
        keep = max(0, min(c, seq_len - p))  # over-long rollouts are cut, never silently dropped
        return Sample(
            input_ids=self.prompt_ids + self.completion.token_ids[:keep],
            sampling_logprobs=[0.0] * p + self.completion.logprobs[:keep],
            advantages=[0.0] * p + [advantage] * keep,
            channel_weights={"rl": [0.0] * p + [1.0] * keep},
            temperature=temperature,
            policy_version=self.completion.weight_version,
        )


async def rollout(client: InferenceClient, tok: PreTrainedTokenizerBase, task: vf.Task,
                  sampling: SamplingConfig, seed: int, sem: asyncio.Semaphore) -> Rollout:
    prompt_ids = encode_chat(tok, messages(task))
    params = {"max_tokens": sampling.max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
              "seed": seed, "stop_token_ids": [tok.eos_token_id], "logprobs": 1, "skip_special_tokens": False}
    async with sem:
        completion = await client.generate(prompt_ids, params)
    reply = tok.decode(completion.token_ids, skip_special_tokens=True)
    reward, metrics = await score(task, reply)
    return Rollout(task, prompt_ids, completion, reward, metrics)


async def group(client: InferenceClient, tok: PreTrainedTokenizerBase, task: vf.Task, sampling: SamplingConfig,
                size: int, seed: int, sem: asyncio.Semaphore) -> list[Rollout]:
    return list(await asyncio.gather(*(rollout(client, tok, task, sampling, seed * 1000 + i, sem) for i in range(size))))

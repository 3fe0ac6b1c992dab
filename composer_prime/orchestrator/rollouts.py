"""One rollout and one group: render the prompt, generate through the token route, run tools, score.

A single-turn task is one generation. A task with tools (`open_session`, docs/environments.md)
is a conversation: each model turn is sampled, a tool call in it is run by the task's session,
and the tool's reply is appended as tokens. The rollout keeps one token sequence with a mask of
what the model sampled, so the trainer learns from model tokens only, at their sampling log-probs.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field

import verifiers.v1 as vf
from transformers import PreTrainedTokenizerBase

from composer_prime.config.models import SamplingConfig
from composer_prime.orchestrator.client import InferenceClient
from composer_prime.orchestrator.envs import messages, score
from composer_prime.orchestrator.episode import TURN_SEED_STRIDE, Turn, converse, tool_metrics
from composer_prime.orchestrator.error_sites import ErrorSite, detect, site_metrics
from composer_prime.trainer.loss.distill import Teacher
from composer_prime.transports.batches.schema import Sample
from composer_prime.utils.chat import continuation_ids, encode_chat


@dataclass
class Rollout:
    env: str
    task: vf.Task
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)  # model and tool tokens after the prompt
    logprobs: list[float] = field(default_factory=list)  # sampling log-prob on model tokens, 0 elsewhere
    model_mask: list[int] = field(default_factory=list)  # 1 where the model sampled the token
    turns: list[Turn] = field(default_factory=list)
    weight_version: int = 2**62  # the oldest policy that sampled any of its turns
    finish_reason: str = ""
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    opening: list[dict] = field(default_factory=list)  # the task's messages before the first turn
    tools: list[dict] = field(default_factory=list)  # the session's tool schemas
    sites: list[ErrorSite] = field(default_factory=list)  # turns that went wrong, and why
    teachers: list[Teacher] = field(default_factory=list)  # hinted views of error turns (distill channel)

    @property
    def model_tokens(self) -> int:
        return sum(self.model_mask)

    def append(self, ids: list[int], logprobs: list[float] | None = None) -> None:
        self.completion_ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.model_mask += [1 if logprobs is not None else 0] * len(ids)

    def to_sample(self, advantage: float, temperature: float, seq_len: int, rl: bool = True) -> Sample:
        """`rl` False: a distill-only sample (its group had no reward spread to learn from)."""
        p = len(self.prompt_ids)
        keep = max(0, min(len(self.completion_ids), seq_len - p))  # over-long rollouts are cut, never silently dropped
        mask = self.model_mask[:keep]
        weights = {"rl": [0.0] * p + [float(m and rl) for m in mask]}
        teachers = [t for t in self.teachers if t.student_start + t.length <= p + keep]  # a cut error turn is not distilled
        if teachers:
            weights["distill"] = [0.0] * (p + keep)
            for t in teachers:
                weights["distill"][t.student_start: t.student_start + t.length] = [1.0] * t.length
        return Sample(
            input_ids=self.prompt_ids + self.completion_ids[:keep],
            sampling_logprobs=[0.0] * p + self.logprobs[:keep],
            advantages=[0.0] * p + [advantage * m for m in mask],
            channel_weights=weights,
            temperature=temperature,
            policy_version=self.weight_version,
            channel_data={"distill": [asdict(t) for t in teachers]} if teachers else {},
        )


async def rollout(client: InferenceClient, tok: PreTrainedTokenizerBase, env: str, task: vf.Task,
                  sampling: SamplingConfig, seq_len: int, max_turns: int, seed: int, sem: asyncio.Semaphore) -> Rollout:
    history = messages(task)
    r = Rollout(env, task, encode_chat(tok, history), opening=list(history))

    async def sample(k: int) -> Turn | None:
        budget = min(sampling.max_tokens, seq_len - len(r.prompt_ids) - len(r.completion_ids))
        if budget < 1:
            r.finish_reason = "length"
            return None
        params = {"max_tokens": budget, "temperature": sampling.temperature, "top_p": sampling.top_p,
                  "seed": seed + k * TURN_SEED_STRIDE, "stop_token_ids": [tok.eos_token_id], "logprobs": 1,
                  "skip_special_tokens": False}
        async with sem:
            c = await client.generate(r.prompt_ids + r.completion_ids, params)
        start = len(r.completion_ids)
        r.append(c.token_ids, c.logprobs)
        r.weight_version = min(r.weight_version, c.weight_version)
        r.finish_reason = c.finish_reason
        return Turn(tok.decode(c.token_ids, skip_special_tokens=True), c.finish_reason, start, len(r.completion_ids))

    def add_tool_reply(turn: Turn, message: dict) -> None:
        nonlocal history
        r.append(continuation_ids(tok, history, turn.text, [message]))
        history = history + [{"role": "assistant", "content": turn.text}, message]

    session = await task.open_session() if hasattr(task, "open_session") else None
    r.tools = list(getattr(session, "tools", None) or [])
    try:
        r.turns = await converse(sample, add_tool_reply, session, max_turns)
        r.reward, r.metrics = await score(task, r.turns[-1].text if r.turns else "", session)
    finally:
        if session is not None:
            await session.close()
    if session is not None:
        r.sites = detect(r.turns, r.tools, getattr(task, "error_rules", None))
        r.metrics |= tool_metrics(r.turns) | site_metrics(r.sites)
    return r



async def group(client: InferenceClient, tok: PreTrainedTokenizerBase, env: str, task: vf.Task, sampling: SamplingConfig,
                seq_len: int, max_turns: int, size: int, seed: int, sem: asyncio.Semaphore) -> list[Rollout]:
    return list(await asyncio.gather(*(rollout(client, tok, env, task, sampling, seq_len, max_turns, seed * 1000 + i, sem)
                                       for i in range(size))))

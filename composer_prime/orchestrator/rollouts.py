"""One rollout and one group: render the prompt, generate through the token route, run tools, score.

The episode itself (tool session, conversation loop, scoring, error sites) is the environment
runtime's `run_episode`, whatever the environment's kind; what is the orchestrator's own is how a
turn is generated: sampled as token ids through the inference server's token route and appended
to one token sequence with a mask of what the model sampled, so the trainer learns from model
tokens only, at their sampling log-probs. A tool's reply is appended as the chat template renders
it, never re-tokenising what came before. A rollout whose environment failed it (EpisodeFault: a
reward or tool call past its environment's call_timeout_s too, env_runtime/calls.py) comes back marked `dropped`
with the reason, to be counted and left out. Waiting on inference is this process's watchdog status
(utils/watchdog.py), and each finished rollout counts as progress within a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from dataclasses import dataclass, field

import verifiers.v1 as vf
from transformers import PreTrainedTokenizerBase

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.batches import Sample
from composer_prime.contract.inference import completion_end
from composer_prime.env_runtime.calls import CallBox
from composer_prime.env_runtime.episode import TURN_SEED_STRIDE, EpisodeFault, open_episode, run_episode
from composer_prime.env_runtime.error_sites import ErrorSite
from composer_prime.env_runtime.errors import EnvError
from composer_prime.env_runtime.turns import Turn
from composer_prime.orchestrator.client import InferenceClient
from composer_prime.utils import watchdog
from composer_prime.utils.chat import continuation_ids, prompt_ids


@dataclass
class Rollout:
    env: str
    task: vf.Task  # or another kind's task (env_runtime/envs.py)
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)  # model and tool tokens after the prompt
    logprobs: list[float] = field(default_factory=list)  # sampling log-prob on model tokens, 0 elsewhere
    model_mask: list[int] = field(default_factory=list)  # 1 where the model sampled the token
    turns: list[Turn] = field(default_factory=list)
    weight_version: int = 2**62  # the oldest policy that sampled any of its turns
    nodes: list[str] = field(default_factory=list)  # the inference nodes that sampled its turns, in order
    unverified: list[str] = field(default_factory=list)  # "<node>: <check>" for each turn a validator rejected
    finish_reason: str = ""
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    opening: list[dict] = field(default_factory=list)  # the task's messages before the first turn
    tools: list[dict] = field(default_factory=list)  # the session's tool schemas
    sites: list[ErrorSite] = field(default_factory=list)  # turns that went wrong, and why
    dropped: str | None = None  # why the environment failed the episode (episode.FAULTS); never trained on
    dropped_detail: str = ""  # the fault's message
    box: CallBox | None = None  # where its environment's code runs (a later tool session, the lift draws', runs there too)

    @property
    def model_tokens(self) -> int:
        return sum(self.model_mask)

    def append(self, ids: list[int], logprobs: list[float] | None = None) -> None:
        self.completion_ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.model_mask += [1 if logprobs is not None else 0] * len(ids)

    def to_sample(self, advantage: float, temperature: float, seq_len: int) -> Sample:
        """The `rl` sample of this rollout, cut to `seq_len`; other channels add their weights and
        data to it (orchestrator/batch.py)."""
        p = len(self.prompt_ids)
        keep = max(0, min(len(self.completion_ids), seq_len - p))  # over-long rollouts are cut, never silently dropped
        mask = self.model_mask[:keep]
        return Sample(
            input_ids=self.prompt_ids + self.completion_ids[:keep],
            sampling_logprobs=[0.0] * p + self.logprobs[:keep],
            advantages=[0.0] * p + [advantage * m for m in mask],
            channel_weights={"rl": [0.0] * p + [float(m) for m in mask]},
            temperature=temperature,
            policy_version=self.weight_version,
        )


class TokenTurns:
    """Turns sampled as token ids through the token route, appended to the rollout's sequence."""

    def __init__(self, r: Rollout, client: InferenceClient, tok: PreTrainedTokenizerBase, sampling: SamplingParams,
                 seq_len: int, seed: int, sem: asyncio.Semaphore) -> None:
        self.r, self.client, self.tok, self.sampling = r, client, tok, sampling
        self.seq_len, self.seed, self.sem = seq_len, seed, sem
        self.history = list(r.opening)

    async def sample(self, k: int) -> Turn | None:
        r = self.r
        budget = min(self.sampling.max_tokens, self.seq_len - len(r.prompt_ids) - len(r.completion_ids))
        if budget < 1:
            r.finish_reason = "length"
            return None
        seed = self.sampling.seed if self.sampling.seed is not None else self.seed + k * TURN_SEED_STRIDE
        params = self.sampling.model_copy(update={"max_tokens": budget, "seed": seed}).or_eos(self.tok.eos_token_id)
        async with self.sem:
            with watchdog.waiting("inference", f"a turn of {r.env}"):
                c = await self.client.generate(r.prompt_ids + r.completion_ids, params)
        if (end := completion_end(c.token_ids, params.stop_token_ids)) < len(c.token_ids):
            # a server that ran past its stop token: what follows is no part of the turn (nor of its reward)
            c = dataclasses.replace(c, token_ids=c.token_ids[:end], logprobs=c.logprobs[:end], finish_reason="stop")
        start = len(r.completion_ids)
        r.append(c.token_ids, c.logprobs)
        r.weight_version = min(r.weight_version, c.weight_version)
        if c.node not in r.nodes:
            r.nodes.append(c.node)
        if c.verdict:
            r.unverified.append(f"{c.node}: {c.verdict}")
        r.finish_reason = c.finish_reason
        return Turn(self.tok.decode(c.token_ids, skip_special_tokens=True), c.finish_reason, start, len(r.completion_ids))

    def add_tool_reply(self, turn: Turn, message: dict) -> None:
        self.r.append(continuation_ids(self.tok, self.history, turn.text, [message]))
        self.history = self.history + [{"role": "assistant", "content": turn.text}, message]


async def rollout(client: InferenceClient, tok: PreTrainedTokenizerBase, env: str, task: vf.Task,
                  sampling: SamplingParams, seq_len: int, max_turns: int, seed: int, sem: asyncio.Semaphore,
                  box: CallBox | None = None) -> Rollout:
    r = Rollout(env, task, [], box=box)
    try:
        opened = await open_episode(task, box)
    except EpisodeFault as e:
        r.dropped, r.dropped_detail = e.reason, str(e)
        return r
    try:
        r.opening = list(opened.opening)
        r.prompt_ids = prompt_ids(tok, opened.opening, tools=opened.tools if opened.render_tools else None)
    except BaseException:
        with contextlib.suppress(EpisodeFault):  # its close hung too: the error above is the one to tell
            await opened.close()
        raise
    try:
        ep = await run_episode(task, TokenTurns(r, client, tok, sampling, seq_len, seed, sem), max_turns, opened)
    except EpisodeFault as e:
        r.dropped, r.dropped_detail = e.reason, str(e)
        return r
    r.turns, r.reward, r.metrics, r.tools, r.sites = ep.turns, ep.reward, ep.metrics, ep.tools, ep.sites
    watchdog.active()
    return r


async def group(client: InferenceClient, tok: PreTrainedTokenizerBase, env: str, task: vf.Task, sampling: SamplingParams,
                seq_len: int, max_turns: int, size: int, seed: int, sem: asyncio.Semaphore,
                box: CallBox | None = None) -> list[Rollout]:
    return list(await asyncio.gather(*(rollout(client, tok, env, task, sampling, seq_len, max_turns, seed * 1000 + i, sem, box)
                                       for i in range(size))))


def stop_if_every_call_timed_out(when: str, rollouts: list[Rollout], boxed: set[str]) -> None:
    """One line (EnvError: the orchestrator exits 2) where every rollout of an environment among `rollouts`
    of `when` (a step, a held-out evaluation) was dropped for a call past its call_timeout_s (`boxed`:
    environments whose code runs in a CallBox: rewards, tool sessions): a reward or a tool that never
    returns leaves nothing to train on, and waiting step after step would only hide it."""
    for env in sorted({r.env for r in rollouts} & boxed):
        mine = [r for r in rollouts if r.env == env]
        if all(r.dropped == "timeout" for r in mine):
            slow = "a reward" if "reward function did not return" in mine[0].dropped_detail else "a tool"
            raise EnvError(f"every rollout of {env} in {when} timed out ({len(mine)} of {len(mine)}): "
                           f"{mine[0].dropped_detail} ({slow} that is only slow needs a larger call_timeout_s)")


def dropped_note(dropped: dict[str, list[Rollout]]) -> str:
    """For the step's progress line: the rollouts dropped, by reason, and where a timed-out one hung."""
    rollouts = [r for rs in dropped.values() for r in rs]
    if not rollouts:
        return ""
    reasons = {k: sum(r.dropped == k for r in rollouts) for k in sorted({r.dropped for r in rollouts})}
    late = next((r for r in rollouts if r.dropped == "timeout"), None)
    where = f" ({late.dropped_detail})" if late is not None else ""
    return " | dropped " + ", ".join(f"{k} {n}" for k, n in reasons.items()) + where

"""One episode of a task, independent of how a turn is generated: the one sequence the
orchestrator's rollouts, `composer-prime env eval` and (for scoring) `env validate` share.

The orchestrator samples turns as token ids through the token route (orchestrator/rollouts.py);
`env eval` samples them as chat messages from any OpenAI-compatible server (hub/evaluate.py).
Both hand `run_episode` a `TurnSource`, and it does the rest: open the task's tool session,
converse (sample a turn, parse its tool call, run it in the session, append the tool's reply,
until a reply makes no call, the session says done, or the turn limit), score the final reply,
close the session, and find the turns that went wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import verifiers.v1 as vf

from composer_prime.env_runtime.error_sites import ErrorSite, detect, site_metrics
from composer_prime.env_runtime.tasksets import score
from composer_prime.env_runtime.tool_calls import parse_tool_call
from composer_prime.env_runtime.turns import Turn, tool_message, tool_metrics

TURN_SEED_STRIDE = 7_777_777  # turn k samples with seed + k * stride: distinct, reproducible streams


class TurnSource(Protocol):
    """How turns are generated: the only part of an episode that differs between callers."""

    async def sample(self, k: int) -> Turn | None:
        """Generate turn k from the context so far (None: no room left)."""

    def add_tool_reply(self, turn: Turn, message: dict) -> None:
        """Append the tool's message to the context the next turn sees."""


@dataclass
class Episode:
    turns: list[Turn]
    reward: float
    metrics: dict[str, float]
    multi_turn: bool  # the task opened a tool session
    tools: list[dict] = field(default_factory=list)  # the session's tool schemas
    sites: list[ErrorSite] = field(default_factory=list)  # turns that went wrong, and why (tasks with tools)

    @property
    def reply(self) -> str:
        return self.turns[-1].text if self.turns else ""


async def converse(source: TurnSource, session: Any, max_turns: int) -> list[Turn]:
    """The conversation loop. Without a session (a single-turn task) this is one sampled turn."""
    turns: list[Turn] = []
    for k in range(max_turns if session is not None else 1):
        turn = await source.sample(k)
        if turn is None:
            break
        turns.append(turn)
        if session is None:
            break
        turn.call = parse_tool_call(turn.text)
        if turn.call is None or turn.finish_reason != "stop":
            break
        if turn.call.error:
            turn.result = {"content": turn.call.error, "is_error": True, "done": False}
        else:
            turn.result = await session.call(turn.call.name, turn.call.arguments)
        if turn.result.get("done") or k == max_turns - 1:
            break
        source.add_tool_reply(turn, tool_message(turn.result))
    return turns


async def open_session(task: vf.Task) -> Any:
    """The task's tool session (tasks with tools, docs/environments.md), else None."""
    return await task.open_session() if hasattr(task, "open_session") else None


async def run_episode(task: vf.Task, source: TurnSource, max_turns: int) -> Episode:
    session = await open_session(task)
    tools = list(getattr(session, "tools", None) or [])
    try:
        turns = await converse(source, session, max_turns)
        reward, metrics = await score(task, turns[-1].text if turns else "", session)
    finally:
        if session is not None:
            await session.close()
    sites: list[ErrorSite] = []
    if session is not None:
        sites = detect(turns, tools, getattr(task, "error_rules", None))
        metrics |= tool_metrics(turns) | site_metrics(sites)
    return Episode(turns, reward, metrics, session is not None, tools, sites)

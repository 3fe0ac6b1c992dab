"""The conversation loop of a task with tools, independent of how a turn is generated.

The orchestrator samples turns as token ids through the token route (rollouts.py); `env eval`
samples them as chat messages from any OpenAI-compatible server (envs/hub/evaluate.py). Both
run the same loop: sample a turn, parse its tool call, run it in the task's session, append the
tool's reply, until a reply makes no call, the session says done, or the turn limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from composer_prime.orchestrator.tool_calls import ParsedCall, parse_tool_call

TURN_SEED_STRIDE = 7_777_777  # turn k samples with seed + k * stride: distinct, reproducible streams


@dataclass
class Turn:
    text: str
    finish_reason: str  # "stop" | "length"
    start: int = 0  # token-level samplers: this turn's model tokens are completion_ids[start:end]
    end: int = 0
    call: ParsedCall | None = None  # the tool call it made, if any
    result: dict | None = None  # the tool's reply {"content", "is_error", "done"}

    @property
    def error(self) -> str | None:
        """Why this turn's tool call failed (unparseable, unknown tool, bad arguments, tool error)."""
        if self.call is not None and self.call.error:
            return self.call.error
        return self.result["content"] if self.result and self.result.get("is_error") else None


def tool_message(result: dict) -> dict:
    return {"role": "tool", "content": ("error: " if result["is_error"] else "") + result["content"]}


async def converse(sample: Callable[[int], Awaitable[Turn | None]], add_tool_reply: Callable[[Turn, dict], None],
                   session: Any, max_turns: int) -> list[Turn]:
    """Run one episode. `sample(k)` generates turn k (None: no room left); `add_tool_reply(turn,
    message)` appends the tool's message to the context the next turn sees. Without a session
    (a single-turn task) this is one sampled turn."""
    turns: list[Turn] = []
    for k in range(max_turns if session is not None else 1):
        turn = await sample(k)
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
        add_tool_reply(turn, tool_message(turn.result))
    return turns


def tool_metrics(turns: list[Turn]) -> dict[str, float]:
    calls = [t for t in turns if t.call is not None]
    return {"turns": float(len(turns)), "tool_calls": float(len(calls)),
            "tool_errors": float(sum(t.error is not None for t in calls))}

"""One episode of a task, independent of how a turn is generated: the one sequence the
orchestrator's rollouts, `composer-prime env eval` and (for scoring) `env validate` share.

The orchestrator samples turns as token ids through the token route (orchestrator/rollouts.py);
`env eval` samples them as chat messages from any OpenAI-compatible server (hub/evaluate.py).
Both hand `run_episode` a `TurnSource`, and it does the rest: open the episode (the task's tool
session, the messages before the first turn, the tools), converse (sample a turn, parse its tool
call, run it in the session, append the tool's reply, until a reply makes no call, the session
says done, or the turn limit), score the final reply, close the session, and find the turns that
went wrong.

Whatever the environment's kind, an episode is this one sequence: a verifiers Task opens its
session in-process and is scored by its own rewards; a task of another kind (an OpenEnv server's,
env_runtime/openenv.py) brings its own `open_episode`, whose session talks to the server and
whose score is the server's reward. A fault of the environment's machinery (not of the model's
turns) is an `EpisodeFault`: the caller drops the rollout and counts it by its reason. A verifiers
Task's own code runs in its environment's `CallBox` when the caller gives one (env_runtime/calls.py):
opening its tool session, each tool call in it, its scoring and the session's close. A reward or a
tool that never returns is cut at the box's timeout, a fault of reason "timeout" naming the place.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

import verifiers.v1 as vf

from composer_prime.env_runtime.calls import CallBox, CallTimeout
from composer_prime.env_runtime.error_sites import ErrorSite, detect, site_metrics
from composer_prime.env_runtime.tasksets import messages, score
from composer_prime.env_runtime.tool_calls import parse_tool_call
from composer_prime.env_runtime.turns import Turn, tool_message, tool_metrics

TURN_SEED_STRIDE = 7_777_777  # turn k samples with seed + k * stride: distinct, reproducible streams
# Why an episode's environment failed it (EpisodeFault.reason): its server died or closed the
# connection, refused the session at capacity, did not answer in time, answered with an
# observation its own schema rejects, or refused a request with an error of its own.
FAULTS = ("server_died", "capacity", "timeout", "schema", "refused")


class EpisodeFault(Exception):
    """The environment failed this episode; the rollout is dropped and counted by `reason`."""

    def __init__(self, reason: str, message: str) -> None:
        assert reason in FAULTS, reason
        super().__init__(message)
        self.reason = reason


class TurnSource(Protocol):
    """How turns are generated: the only part of an episode that differs between callers."""

    async def sample(self, k: int) -> Turn | None:
        """Generate turn k from the context so far (None: no room left)."""

    def add_tool_reply(self, turn: Turn, message: dict) -> None:
        """Append the tool's message to the context the next turn sees."""


@dataclass
class Opened:
    """An episode once open: what the first turn sees and how the last reply is scored."""

    session: Any  # the tool session (call, close, tools), None for a single-turn task
    opening: list[dict]  # the chat messages before the first turn
    tools: list[dict]  # the session's tool schemas (OpenAI function format)
    score: Callable[[str], Awaitable[tuple[float, dict[str, float]]]]  # final reply -> (reward, metrics)
    render_tools: bool = False  # the chat template renders `tools` into the prompt (the task's prompt does not describe them)
    box: CallBox | None = None  # where the session's calls run (a verifiers Task's), under its timeout
    what: str = ""  # which task, for a timed-out call's message

    async def call(self, name: str, arguments: dict | None) -> dict:
        """One tool call in the session (in the box, when there is one: EpisodeFault "timeout" past its time)."""
        return await _boxed(self.box, lambda: self.session.call(name, arguments), self.what, f"tool {name}")

    async def close(self) -> None:
        if self.session is not None:
            await _boxed(self.box, self.session.close, self.what, "session's close")


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


async def _boxed(box: CallBox | None, make: Callable[[], Awaitable[Any]], what: str, fn: str) -> Any:
    """`await make()`, in `box` when given: its timeout is an EpisodeFault of reason "timeout" naming `fn`."""
    if box is None:
        return await make()
    try:
        return await box.call(make, what, f"{box.name}'s {fn}")
    except CallTimeout as e:
        raise EpisodeFault("timeout", str(e)) from None


async def converse(source: TurnSource, opened: Opened, max_turns: int) -> list[Turn]:
    """The conversation loop. Without a session (a single-turn task) this is one sampled turn."""
    turns: list[Turn] = []
    session = opened.session
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
            turn.result = await opened.call(turn.call.name, turn.call.arguments)
        if turn.result.get("done") or k == max_turns - 1:
            break
        source.add_tool_reply(turn, tool_message(turn.result))
    return turns


async def open_session(task: vf.Task) -> Any:
    """The task's tool session (tasks with tools, docs/environments.md), else None."""
    return await task.open_session() if hasattr(task, "open_session") else None


async def open_episode(task: Any, box: CallBox | None = None) -> Opened:
    """Open an episode of `task`: its own `open_episode` (another kind's task), else a verifiers
    Task's tool session, prompt and rewards (scored in `box`, when given, under its timeout)."""
    if (own := getattr(task, "open_episode", None)) is not None:
        return await own()
    what = f"task {task.data.id}"
    # a task without tools has no session to open: no trip through the box, whose threads would stagger the group's
    # first requests so that the client no longer joins them into one (test_bench_runs: 33 requests a step, not 16)
    session = await _boxed(box, lambda: open_session(task), what, "open_session") if hasattr(task, "open_session") else None

    async def score_reply(reply: str) -> tuple[float, dict[str, float]]:
        return await _boxed(box, lambda: score(task, reply, session), what, "reward function")

    return Opened(session, messages(task), list(getattr(session, "tools", None) or []), score_reply, box=box, what=what)


async def run_episode(task: Any, source: TurnSource, max_turns: int, opened: Opened | None = None,
                      box: CallBox | None = None) -> Episode:
    """One episode; `opened` when the caller opened it already (to build its prompt from the
    opening), else it is opened here (scored in `box`). Raises EpisodeFault when the environment fails it."""
    opened = opened if opened is not None else await open_episode(task, box)
    session, tools = opened.session, opened.tools
    try:
        turns = await converse(source, opened, max_turns)
        reward, metrics = await opened.score(turns[-1].text if turns else "")
    except BaseException:
        with suppress(EpisodeFault):  # a close that hangs too: the first fault is the one to tell
            await opened.close()
        raise
    await opened.close()
    sites: list[ErrorSite] = []
    if session is not None:
        sites = detect(turns, tools, getattr(task, "error_rules", None))
        metrics |= tool_metrics(turns) | site_metrics(sites)
    return Episode(turns, reward, metrics, session is not None, tools, sites)

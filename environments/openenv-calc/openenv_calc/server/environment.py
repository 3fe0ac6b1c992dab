"""The openenv-calc environment: openenv's `MCPEnvironment` with two FastMCP tools.

One instance per WebSocket session (openenv's server makes one per connection). `reset`
draws the question of (split, seed); `calc` and `answer` are steps of `CallToolAction`. The
step that calls `answer` ends the episode (`done`) and carries its reward; every other step
carries 0.0. A wrong call is a tool error, as MCP reports it: a tool that does not exist,
arguments its schema rejects, an expression calc cannot read.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.utils import run_async_safely
from pydantic import Field

from openenv_calc.calc import SYSTEM_PROMPT, evaluate, question, reward


class CalcObservation(Observation):
    """What `reset` returns: the question as chat messages."""

    messages: list[dict] = Field(default_factory=list, description="system prompt and question")
    question: str = Field(default="", description="the expression to compute")


class CalcEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own episode; nothing is shared

    def __init__(self) -> None:
        mcp = FastMCP("openenv-calc")

        @mcp.tool
        def calc(expr: str) -> str:
            """Evaluate one integer expression: integer, operator (+ - *), integer."""
            try:
                return str(evaluate(expr))
            except ValueError as e:
                raise ToolError(str(e)) from None

        @mcp.tool
        def answer(text: str) -> str:
            """Give the final answer: the episode ends and the answer is scored."""
            if self._value is None or self._done:
                raise ToolError("no episode in progress: reset first")
            self._done, self._reward = True, reward(self._calls[:1] == [True], text, self._value)
            return f"reward {self._reward}"

        super().__init__(mcp)
        self._value: int | None = None
        self._calls: list[bool] = []  # whether each tool call before the answer worked
        self._done, self._reward = False, 0.0
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, split: str = "train",
              max_operand: int = 99, **kwargs: Any) -> CalcObservation:
        a, op, b = question(split, seed if seed is not None else uuid.uuid4().int % 2**31, max_operand)
        expr = f"{a} {op} {b}"
        self._value, self._calls, self._done, self._reward = evaluate(expr), [], False, 0.0
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": expr}]
        return CalcObservation(messages=messages, question=expr)

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        if isinstance(action, CallToolAction) and action.tool_name != "answer" and not self._done:
            obs = await super().step_async(action, timeout_s=timeout_s, **kwargs)
            self._calls.append(obs.error is None)
        else:
            obs = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction):
            self._state.step_count += 1
            obs.done, obs.reward = self._done, self._reward if self._done else 0.0
        return obs

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return run_async_safely(self.step_async(action, timeout_s=timeout_s, **kwargs))

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(metadata={"error": f"unknown action {type(action).__name__}: call a tool"})

    @property
    def state(self) -> State:
        return self._state

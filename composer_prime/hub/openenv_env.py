"""One of our verifiers v1 environments as an OpenEnv environment (`composer-prime env serve`).

Built on OpenEnv's own classes (openenv 0.10): `MCPEnvironment`, served by `create_app`, so
OpenEnv's clients (`GenericEnvClient`, `MCPToolClient`) and TRL's `environment_factory` train on
it over the real protocol (`/ws` episodes, `/mcp` tools). Nothing of an episode is ours to
redo here: the tool session, its calls and the scoring are the environment runtime's
(`env_runtime.episode.open_session`, the session's `call`, `env_runtime.tasksets.score`).

An episode, per connection:
- `reset(index=i)` (or `seed=s`: task s mod n; neither: a random task) opens task i's tool session
  and returns its chat prompt (`messages`, `task_id`, `index`);
- the MCP tools are the session's tools (their schemas as the environment gives them) plus
  `answer(text)`: the final reply, which ends the episode and is scored by the Task's
  `@vf.reward`s; a tool that says it is done (feature-deletion's `submit`) ends it too, scored
  with an empty reply;
- every tool result is the session's reply `{"content", "is_error", "done"}` plus `reward` (None
  until the episode ends). A tool's own error is in the result, as OpenEnv's MCP types put it,
  not a transport error: the agent reads it as the tool's reply, as in our rollouts;
- over `/ws` the step that ends the episode carries the reward (`done`), every other step 0.0.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Any

from fastmcp import FastMCP
from fastmcp.tools.base import Tool, ToolResult
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolObservation
from openenv.core.env_server.types import Observation, State
from openenv.core.utils import run_async_safely
from pydantic import Field, PrivateAttr

from composer_prime.env_runtime.episode import open_session
from composer_prime.env_runtime.tasksets import messages, score

ANSWER = "answer"
ANSWER_SCHEMA = {"type": "function", "function": {
    "name": ANSWER, "description": "Give your final reply: the episode ends and the reply is scored.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string", "description": "the final reply"}},
                   "required": ["text"], "additionalProperties": False}}}
# OpenEnv gives a tool call 30 s unless the step says otherwise; a tool of ours bounds its own
# work (feature-deletion's test runs and scoring are capped by its task config, at most 600 s).
TOOL_TIMEOUT_S = 900.0


class TaskObservation(Observation):
    """What `reset` returns: the task's chat prompt."""

    messages: list[dict] = Field(default_factory=list, description="the task's prompt: system and user messages")
    task_id: str = Field(default="", description="the task's id in its taskset")
    index: int = Field(default=0, description="the task's position among the served tasks")


@dataclass(frozen=True)
class Served:
    """What every connection's environment shares (read-only): the tasks and their tool schemas."""

    name: str  # the environment id
    tasks: list  # verifiers Tasks
    tools: list[dict]  # OpenAI function schemas: the first task's session's, then `answer`
    split: str  # the taskset's split, for OpenEnv's task API


def task_id(task: Any, index: int) -> str:
    return task.data.id or task.data.name or str(index)


async def session_tools(tasks: list) -> list[dict]:
    """The tool schemas the tasks' sessions offer (read from the first task's; a taskset's tasks
    share their tools), then `answer`. ValueError when a tool would shadow `answer`."""
    session = await open_session(tasks[0])
    try:
        tools = list(getattr(session, "tools", None) or [])
    finally:
        if session is not None:
            await session.close()
    if ANSWER in [t["function"]["name"] for t in tools]:
        raise ValueError(f"the environment has a tool named '{ANSWER}', the name its final reply is served under")
    return [*tools, ANSWER_SCHEMA]


class EpisodeTool(Tool):
    """One MCP tool: a call goes to the episode of the connection's environment."""

    _env: Any = PrivateAttr()  # the TaskEnvironment of the connection

    @classmethod
    def of(cls, schema: dict, env: TaskEnvironment) -> EpisodeTool:
        fn = schema["function"]
        tool = cls(name=fn["name"], description=fn.get("description", ""), parameters=fn.get("parameters") or {})
        tool._env = env
        return tool

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        result = await self._env.call(self.name, arguments)
        return ToolResult(content=result["content"], structured_content=result)


class TaskEnvironment(MCPEnvironment):
    """One connection's episodes over the served tasks."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each connection has its own tool session; the tasks are read-only

    def __init__(self, served: Served) -> None:
        server = FastMCP(served.name)
        for schema in served.tools:
            server.add_tool(EpisodeTool.of(schema, self))
        super().__init__(server)
        self.served = served
        self._task: Any = None
        self._session: Any = None
        self._done, self._reward, self._metrics, self._unreported = False, None, {}, None
        self._state = State()

    # -- the episode ------------------------------------------------------------------------

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None, index: int | None = None,
                          **kwargs: Any) -> TaskObservation:
        await self._close_session()
        n = len(self.served.tasks)
        if index is None:
            index = seed % n if seed is not None else random.randrange(n)
        if not 0 <= index < n:
            raise ValueError(f"index {index} is out of range: {self.served.name} serves {n} tasks (0 to {n - 1})")
        self._task = self.served.tasks[index]
        self._session = await open_session(self._task)
        self._done, self._reward, self._metrics, self._unreported = False, None, {}, None
        tid = task_id(self._task, index)
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0, task_id=tid, index=index)
        return TaskObservation(messages=messages(self._task), task_id=tid, index=index)

    def reset(self, seed: int | None = None, episode_id: str | None = None, index: int | None = None,
              **kwargs: Any) -> TaskObservation:
        return run_async_safely(self.reset_async(seed, episode_id, index))

    async def call(self, name: str, arguments: dict[str, Any]) -> dict:
        """A tool call of this episode: the session's reply plus `reward` (see the module docstring)."""
        if self._task is None:
            return self._error("no task yet: reset first")
        if self._done:
            return self._error(f"the episode is over (reward {self._reward}): reset for the next task")
        self._state.step_count += 1
        if name == ANSWER:
            text = arguments.get("text") if isinstance(arguments, dict) else None
            if not isinstance(text, str) or set(arguments) != {"text"}:
                return self._error(f"{ANSWER} takes one argument, 'text': the final reply as a string")
            await self._finish(text)
            return {"content": f"reward {self._reward}", "is_error": False, "done": True, "reward": self._reward,
                    "metrics": self._metrics}
        result = dict(await self._session.call(name, arguments if isinstance(arguments, dict) else {}))
        if result.get("done"):
            await self._finish("")
        return {**result, "reward": self._reward}

    async def _finish(self, reply: str) -> None:
        self._reward, self._metrics = await score(self._task, reply, self._session)
        self._done, self._unreported = True, self._reward
        await self._close_session()

    def _error(self, message: str) -> dict:
        return {"content": message, "is_error": True, "done": self._done, "reward": None}

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- OpenEnv's step: the reward on the step that ended the episode -------------------------

    def _mark(self, obs: Observation) -> Observation:
        if isinstance(obs, CallToolObservation):
            reward, self._unreported = self._unreported, None
            obs.done, obs.reward = self._done, reward if reward is not None else 0.0
            if reward is not None:
                obs.metadata = {**obs.metadata, "metrics": self._metrics, "task_id": self._state.task_id}
        return obs

    async def step_async(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._mark(await super().step_async(action, timeout_s=timeout_s or TOOL_TIMEOUT_S, **kwargs))

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._mark(super().step(action, timeout_s=timeout_s or TOOL_TIMEOUT_S, **kwargs))

    def _step_impl(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(metadata={"error": "this environment takes MCP actions only: list_tools, call_tool"})

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        if self._session is not None:
            run_async_safely(self._close_session())
        super().close()

    # -- OpenEnv's task API (`/{env}/splits`, `/{env}/tasks`, ...): the served split ----------

    def list_splits(self) -> list[str]:
        return [self.served.split]

    def _split(self, split: str) -> list:
        return self.served.tasks if split == self.served.split else []

    def num_tasks(self, split: str) -> int:
        return len(self._split(split))

    def get_task(self, split: str, index: int) -> dict:
        tasks = self._split(split)
        if not 0 <= index < len(tasks):
            raise IndexError(index)
        return {"id": task_id(tasks[index], index), "index": index, "messages": messages(tasks[index])}

    def list_tasks(self, split: str) -> list[dict]:
        return [self.get_task(split, i) for i in range(self.num_tasks(split))]

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict]:
        return [self.get_task(split, i) for i in range(self.num_tasks(split))[start:stop]]

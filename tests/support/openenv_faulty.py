"""An OpenEnv server that fails on request, built with openenv's own classes (for the fault tests):
`uvicorn tests.support.openenv_faulty:app`.

Tools: `slow(seconds)` answers after `seconds`, a step that outlasts the client's timeout (its
session stays taken until it answers, so the server holds 64); `odd()` answers with an
observation that its own /schema rejects (a field the schema forbids).
"""

import asyncio

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State
from pydantic import Field


class PromptObservation(Observation):
    prompt: str = Field(default="Call a tool.")


class Odd(Observation):
    surprise: str = Field(default="a field CallToolObservation's schema forbids")


class FaultyEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("faulty")

        @mcp.tool
        async def slow(seconds: float) -> str:
            """Answer after `seconds`."""
            await asyncio.sleep(seconds)
            return "done"

        @mcp.tool
        def odd() -> str:
            """Answer with an observation the schema rejects."""
            return "odd"

        super().__init__(mcp)

    def reset(self, seed=None, episode_id=None, **kwargs) -> PromptObservation:
        return PromptObservation()

    async def step_async(self, action, timeout_s=None, **kwargs) -> Observation:
        if isinstance(action, CallToolAction) and action.tool_name == "odd":
            return Odd()
        return await super().step_async(action, timeout_s=timeout_s, **kwargs)

    def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:
        return Observation()

    @property
    def state(self) -> State:
        return State()


app = create_app(FaultyEnvironment, CallToolAction, CallToolObservation, env_name="faulty", max_concurrent_envs=64,
                 reset_observation_cls=PromptObservation)

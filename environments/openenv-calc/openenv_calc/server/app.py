"""The openenv-calc app: `uvicorn openenv_calc.server.app:app --host 127.0.0.1 --port 8000`.

openenv's `create_app` serves the environment: episodes over `/ws`, `/health`, `/schema`, MCP
over `/mcp`. It accepts `OPENENV_CALC_SESSIONS` WebSocket sessions at once (default 8); one
more is refused with CAPACITY_REACHED.
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from openenv_calc.server.environment import CalcEnvironment, CalcObservation

SESSIONS = int(os.environ.get("OPENENV_CALC_SESSIONS", "8"))

app = create_app(CalcEnvironment, CallToolAction, CallToolObservation, env_name="openenv_calc",
                 max_concurrent_envs=SESSIONS, reset_observation_cls=CalcObservation)

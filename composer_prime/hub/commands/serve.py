"""`composer-prime env serve ENV [--port P --max-concurrent-envs N]`: one of our environments as
an OpenEnv server (hub/openenv_env.py), for OpenEnv's clients and TRL's `environment_factory`.

It listens on loopback unless told otherwise, and beyond loopback only with keys: then every
route but `/health` wants `Authorization: Bearer <token>` (transports/auth.py), over HTTP and
WebSocket alike. Needs the `openenv` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
from pathlib import Path
from typing import Any

from composer_prime.hub.errors import ToolError, one_line_errors

log = logging.getLogger(__name__)
RISK = "run the environment's tools and read its tasks"


class RequireToken:
    """ASGI: every route but /health answers only a request carrying the token (401, or a refused WebSocket)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                if scope["type"] == "websocket":
                    await receive()  # the connect event; closing before accepting refuses the handshake (403)
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": b'{"detail": "this server needs its token '
                                                                  b'(Authorization: Bearer ...)"}'})
                return
        await self.app(scope, receive, send)


def build_app(env: str, tasks: list, split: str, max_concurrent_envs: int, token: str | None) -> Any:
    """The OpenEnv app (openenv's `create_fastapi_app`) serving `tasks` of environment `env`."""
    import functools

    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

    from composer_prime.hub.openenv_env import Served, TaskEnvironment, TaskObservation, session_tools

    try:
        served = Served(env, tasks, asyncio.run(session_tools(tasks)), split)
        TaskEnvironment(served).close()  # a tool name OpenEnv reserves (reset, step, state, close) fails here, not per connection
    except ValueError as e:
        raise ToolError(f"{env}: {e}") from None
    app = create_fastapi_app(functools.partial(TaskEnvironment, served), CallToolAction, CallToolObservation,
                             max_concurrent_envs=max_concurrent_envs, env_name=env, reset_observation_cls=TaskObservation)
    return RequireToken(app, token) if token else app


@one_line_errors
def run(args: argparse.Namespace) -> int:
    from composer_prime.hub.loading import load_env, taskset_args
    from composer_prime.transports import auth
    from composer_prime.utils.net import bind_error

    try:
        import openenv  # noqa: F401
        import uvicorn
    except ImportError:
        raise ToolError("env serve needs OpenEnv: add `--extra openenv` (uv run --extra openenv composer-prime env serve ...)") from None
    if args.max_concurrent_envs < 1:
        raise ToolError("--max-concurrent-envs must be at least 1")
    token = auth.token(args.keys_dir)
    auth.require("--host", args.host, token is not None, RISK)
    if error := bind_error(args.host, args.port):
        raise ToolError(f"--port {args.port}: cannot listen on {args.host}:{args.port}: {error}")
    config = taskset_args(args.args)
    env, tasks = load_env(args.env, config)
    app = build_app(env, tasks, str(config.get("split", "train")), args.max_concurrent_envs, token)
    log.info("serving %s as an OpenEnv environment: %d tasks, up to %d sessions, on http://%s:%d (/ws episodes, /mcp tools)",
             env, len(tasks), args.max_concurrent_envs, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="serve an installed environment as an OpenEnv server (needs --extra openenv)")
    p.add_argument("env", help="installed environment id (tool-calc, reverse-text, feature-deletion) or package directory")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; beyond loopback needs keys)")
    p.add_argument("--port", type=int, default=8010, help="port to listen on (default 8010: the quickstart's inference has 8000)")
    p.add_argument("--max-concurrent-envs", type=int, default=1,
                   help="episodes served at once, one per connection; one more is refused with CAPACITY_REACHED (default 1)")
    p.add_argument("--args", help='taskset config as JSON, e.g. \'{"split": "eval"}\'')
    p.add_argument("--auth.keys_dir", dest="keys_dir", type=Path,
                   help="keys from `composer-prime keys make --out DIR`: clients must send its inference.token as a Bearer token")
    p.set_defaults(func=run)
    return p

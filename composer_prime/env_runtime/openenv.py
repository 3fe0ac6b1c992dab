"""OpenEnv environments in a run: an OpenEnv server's episodes, driven over its WebSocket route `/ws`.

A task is one `reset` of the server: `reset(seed=i, **args)` for seed i < `num_tasks` (an `args`
key of its own; the other keys go to `reset` as they are). Episodes need a WebSocket session (the
server makes an environment per session; its HTTP `/reset` and `/step` keep no episode); a slot's
session stays open for its next episode, which `reset` starts (openenv_servers.py):
- the reset observation's `messages` (chat messages) open the conversation; without them its
  `prompt` is the user turn, or else the observation itself as JSON;
- the environment's MCP tools (a `list_tools` step, once a session) are the model's tools, rendered
  into the prompt by the chat template; a tool call the model writes is parsed as for any
  environment (env_runtime/tool_calls.py, so error sites and hints work alike) and made as a
  `call_tool` step; the step's result, or its error, is the tool's reply, its `done` ends the episode;
- a final reply without a call goes to the environment's `answer` tool when it has one (its one
  argument is the reply); the episode's reward is the sum of its steps' rewards, the server's.
Only the model's tokens are trained (orchestrator/rollouts.py masks the rest). A fault of the
server (it dies or closes the connection, refuses the session at capacity, does not answer within
`step_timeout_s`, answers with an observation its own /schema rejects, or refuses a request with
its own error) is an EpisodeFault: the rollout is dropped and counted, the session closed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from composer_prime.config.envs import EnvConfig
from composer_prime.env_runtime.episode import EpisodeFault, Opened
from composer_prime.env_runtime.errors import EnvError
from composer_prime.env_runtime.openenv_servers import Schemas, Server, Servers, Slot
from composer_prime.utils import watchdog

ANSWER = "answer"  # the tool a final reply goes to, when the environment has it
TRAIN_TASKS = 1_000_000  # training seeds when `args` names no num_tasks
WS_TIMEOUT = aiohttp.ClientWSTimeout(ws_close=2.0)  # closing a session whose server is gone or stalled waits no longer


# -- the message mapping (pure) ---------------------------------------------------------------

def tool_schemas(tools: list[dict]) -> list[dict]:
    """MCP tools (`name`, `description`, `input_schema`) as the OpenAI function schemas a chat
    template renders and error sites check arguments against."""
    return [{"type": "function", "function": {"name": t["name"], "description": t.get("description") or "",
                                              "parameters": t.get("input_schema") or {"type": "object", "properties": {}}}}
            for t in tools]


def opening_messages(observation: dict) -> list[dict]:
    """The chat messages a reset observation opens the conversation with (see the module docstring)."""
    messages = observation.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                       and isinstance(m.get("content"), str) for m in messages):
        return [{"role": m["role"], "content": m["content"]} for m in messages]
    if isinstance(observation.get("prompt"), str):
        return [{"role": "user", "content": observation["prompt"]}]
    fields = {k: v for k, v in observation.items() if k != "metadata"}
    return [{"role": "user", "content": json.dumps(fields, ensure_ascii=False, sort_keys=True)}]


def tool_reply(step: dict) -> dict:
    """A `call_tool` step's answer as the tool's reply {"content", "is_error", "done"}: the error's
    message, else the result's text content (the result itself as JSON when it has none)."""
    obs, done = step.get("observation") or {}, bool(step.get("done"))
    if isinstance(error := obs.get("error"), dict):
        return {"content": str(error.get("message", "")), "is_error": True, "done": done}
    result = obs.get("result")
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        text = "\n".join(str(c.get("text", "")) for c in result["content"] if isinstance(c, dict) and c.get("type") == "text")
        return {"content": text, "is_error": bool(result.get("is_error")), "done": done}
    return {"content": result if isinstance(result, str) else json.dumps(result, ensure_ascii=False),
            "is_error": False, "done": done}


def answer_argument(tools: list[dict]) -> str | None:
    """The one argument of the environment's `answer` tool; None when it has no such tool."""
    for t in tools:
        props = (t["function"].get("parameters") or {}).get("properties") or {}
        if t["function"]["name"] == ANSWER and len(props) == 1:
            return next(iter(props))
    return None


# -- one episode ---------------------------------------------------------------------------------

class Connection:
    """One WebSocket session: requests and their replies, in order; every failure an EpisodeFault."""

    def __init__(self, ws: Any, timeout_s: float) -> None:
        self.ws, self.timeout_s = ws, timeout_s

    async def request(self, *messages: dict) -> list[dict]:
        """The replies' data to `messages`, sent together (the server answers them in order)."""
        what = "/".join(m["type"] for m in messages)
        try:
            replies = await asyncio.wait_for(self._roundtrip(messages), self.timeout_s)
        except asyncio.TimeoutError:
            raise EpisodeFault("timeout", f"no answer to {what} within {self.timeout_s:g} s") from None
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as e:  # aiohttp: RuntimeError on a closed socket
            raise EpisodeFault("server_died", f"the connection failed: {type(e).__name__}: {e}") from None
        except ValueError as e:  # not JSON
            raise EpisodeFault("schema", f"the reply to {what} is not JSON: {e}") from None
        return replies

    async def _roundtrip(self, messages: tuple[dict, ...]) -> list[dict]:
        try:
            for message in messages:
                await self.ws.send_str(json.dumps(message))
        except ConnectionError:
            pass  # a session refused at capacity: the server sent its error and closed; the error is still to read
        out = []
        for _ in messages:
            m = await self.ws.receive()
            if m.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError(f"the server closed the connection ({m.type.name})")
            reply = json.loads(m.data)
            if reply.get("type") == "error":  # the first error ends the exchange: the rest may never come
                data = reply.get("data") or {}
                reason = "capacity" if data.get("code") == "CAPACITY_REACHED" else "refused"
                raise EpisodeFault(reason, f"{data.get('code')}: {data.get('message')}")
            if not isinstance(reply.get("data"), dict):
                raise EpisodeFault("schema", f"a reply with no data: {str(reply)[:200]}")
            out.append(reply["data"])
        return out


class OpenEnvSession:
    """The tool session of one episode, on a slot's WebSocket session: tool calls are steps, the
    reward is the steps' sum. The WebSocket stays open for the slot's next episode when this one
    ends cleanly (scored); after a fault it is closed."""

    def __init__(self, env: OpenEnvEnv, slot: Slot) -> None:
        self.env, self.slot = env, slot
        self.schemas = env.servers.schemas
        self.conn: Connection | None = None
        self.tools: list[dict] = []
        self.reward, self.done, self.clean = 0.0, False, False

    async def request(self, *messages: dict) -> list[dict]:
        try:  # the watchdog's status: this process waits on the server (its step_timeout_s ends the wait)
            with watchdog.waiting(f"{self.env.cfg.id}'s server", "/".join(m["type"] for m in messages),
                                  time.time() + self.env.cfg.step_timeout_s):
                return await self.conn.request(*messages)
        except EpisodeFault as e:
            await self.discard()
            if e.reason == "server_died":  # started here and dead: start it again for the episodes to come
                await self.env.servers.recover(self.slot.server)
            raise

    async def reset(self, data: dict) -> list[dict]:
        """Reset with `data`; the opening messages. A new session's tools are listed in the same
        exchange and kept for its later episodes (an environment's MCP tools are its own, not an
        episode's). A slot's session whose server went away since its last episode is opened again, once."""
        for attempt in range(2):
            kept = self.slot.ws is not None and not self.slot.ws.closed
            if not kept:
                self.slot.ws, self.slot.tools = await self.env.open_ws(self.slot.server), None
            self.conn = Connection(self.slot.ws, self.env.cfg.step_timeout_s)
            listing = [{"type": "step", "data": {"type": "list_tools"}}] if self.slot.tools is None else []
            try:
                step, *listed = await self.request({"type": "reset", "data": data}, *listing)
                break
            except EpisodeFault as e:
                if not (kept and e.reason == "server_died" and attempt == 0):
                    raise
        self._check(self.schemas.reset, step, "reset")
        if listed:
            tools = (listed[0].get("observation") or {}).get("tools")
            if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools):
                raise EpisodeFault("schema", f"list_tools answered no tool list: {str(tools)[:200]}")
            self.slot.tools = tool_schemas(tools)
        self.tools = self.slot.tools
        return opening_messages(step.get("observation") or {})

    async def call(self, name: str, arguments: dict) -> dict:
        [step] = await self.request({"type": "step", "data": {"type": "call_tool", "tool_name": name,
                                                              "arguments": arguments}})
        self._check(self.schemas.step, step, f"the step calling {name}")
        self.reward += float(step.get("reward") or 0.0)
        reply = tool_reply(step)
        self.done = reply["done"]
        return reply

    async def score(self, reply: str) -> tuple[float, dict[str, float]]:
        """The episode's reward; a final reply that ended nothing goes to `answer` first."""
        if not self.done and (arg := answer_argument(self.tools)) is not None:
            await self.call(ANSWER, {arg: reply})
        self.clean = True
        return self.reward, {}

    async def discard(self) -> None:
        """Close the slot's WebSocket (best effort: the server may be gone)."""
        ws, self.slot.ws, self.slot.tools = self.slot.ws, None, None
        if ws is not None and not ws.closed:
            try:
                await asyncio.wait_for(ws.send_str(json.dumps({"type": "close"})), 1.0)
            except (asyncio.TimeoutError, aiohttp.ClientError, ConnectionError, RuntimeError):
                pass  # the server went away already
            await ws.close()

    async def close(self) -> None:
        try:
            if not self.clean:
                await self.discard()
        finally:
            self.env.servers.release(self.slot)

    @staticmethod
    def _check(schema: Any, step: dict, what: str) -> None:
        if (problem := Schemas.problem(schema, step.get("observation"))) is not None:
            raise EpisodeFault("schema", f"the observation of {what} does not match the server's schema: {problem}")


# -- the environment -------------------------------------------------------------------------------

class OpenEnvTask:
    """One reset of the environment: `reset(seed=seed, **args)`."""

    def __init__(self, env: OpenEnvEnv, seed: int, args: dict) -> None:
        self.env, self.seed, self.args = env, seed, args

    async def open_episode(self) -> Opened:
        session = OpenEnvSession(self.env, await self.env.servers.slot())
        try:
            opening = await session.reset({**self.args, "seed": self.seed})
        except BaseException:
            await session.close()
            raise
        return Opened(session, opening, session.tools, session.score, render_tools=True)


class Seeds(Sequence):
    """Tasks 0..n-1 of the environment, made when drawn (a training set is a million seeds)."""

    def __init__(self, env: OpenEnvEnv, args: dict, n: int) -> None:
        self.env, self.args, self.n = env, args, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return OpenEnvTask(self.env, i % self.n, self.args)


def split_args(args: dict, default_tasks: int, where: str) -> tuple[dict, int]:
    """(reset arguments, number of tasks) of an `args` table."""
    rest = {k: v for k, v in args.items() if k != "num_tasks"}
    n = args.get("num_tasks", default_tasks)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise EnvError(f"{where}: num_tasks must be a positive integer, not {n!r}")
    return rest, n


class OpenEnvEnv:
    """One OpenEnv environment of the mix: its servers, its tasks, its episodes' connections."""

    def __init__(self, cfg: EnvConfig, eval_tasks: int, log_dir: Path) -> None:
        self.cfg = cfg
        self.servers = Servers(cfg.id, cfg.url, cfg.servers, cfg.sessions, log_dir)
        train_args, n = split_args(cfg.args, TRAIN_TASKS, "args")
        eval_args, n_eval = split_args(cfg.eval_args, eval_tasks, "eval_args")
        self.train, self.held_out = Seeds(self, train_args, n), Seeds(self, eval_args, min(n_eval, eval_tasks))[:]
        self._http: aiohttp.ClientSession | None = None
        self.box = None  # no CallBox: the server's reward comes over the wire, each exchange under step_timeout_s

    async def start(self) -> None:
        await self.servers.start()
        self._http = aiohttp.ClientSession()

    async def open_ws(self, server: Server) -> Any:
        """A new WebSocket session on `server`; a server found dead is started again (if started
        here) and tried once more before the episode is dropped."""
        url = server.url.replace("http", "ws", 1) + "/ws"
        for attempt in range(2):
            try:
                return await asyncio.wait_for(self._http.ws_connect(url, max_msg_size=0, timeout=WS_TIMEOUT),
                                              self.cfg.step_timeout_s)
            except asyncio.TimeoutError:
                raise EpisodeFault("timeout", f"{url} did not open a session within {self.cfg.step_timeout_s:g} s") from None
            except (aiohttp.ClientError, ConnectionError) as e:
                if attempt == 0 and await self.servers.recover(server):
                    continue
                raise EpisodeFault("server_died", f"cannot connect to {url}: {type(e).__name__}: {e}") from None

    def stats(self) -> dict[str, float]:
        return {"server_restarts": float(self.servers.restarts)}

    async def close(self) -> None:
        for ws in self.servers.open_sessions():
            await ws.close()
        if self._http is not None:
            await self._http.close()
        self.servers.stop()


def check(cfg: EnvConfig, where: str) -> None:
    """`--dry-run`'s check: the package installed or the URL answering, and `num_tasks` usable."""
    try:
        Servers(cfg.id, cfg.url, cfg.servers, cfg.sessions, Path()).check()
    except EnvError as e:
        raise EnvError(f"{where}: {e}") from None
    for key in ("args", "eval_args"):
        try:
            split_args(getattr(cfg, key), 1, key)
        except EnvError as e:
            raise EnvError(f"{where}.{e}") from None

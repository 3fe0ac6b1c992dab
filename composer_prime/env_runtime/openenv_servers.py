"""The servers behind one OpenEnv environment of a run: started here from an installed package, or
one URL; what the orchestrator checks before it trusts them, and their restart after a death.

openenv 0.10 has no `openenv serve`: an OpenEnv package's server is its ASGI app
`<package>.server.app:app`, served here by uvicorn on loopback (a free port each), as many
servers as configured. Each accepts `sessions` WebSocket sessions at once (its
`max_concurrent_envs`): a slot each, whose session stays open from one episode to the next (a
`reset` starts the next), so an episode pays no connection. An episode takes a slot for its whole
length and waits for one when all are taken, so the servers are never asked for more sessions
than they were said to hold.

A server is trusted once it answers `GET /health` and `GET /schema` (the observation schemas the
episodes' observations are checked against). A server started here that dies is started again,
on its port, by the first episode that finds it dead; the others wait for it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from jsonschema import Draft202012Validator

from composer_prime.env_runtime.errors import EnvError
from composer_prime.utils.net import free_port
from composer_prime.utils.proc import die_with_parent

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0  # a server's start: openenv's import and the package's own, a few seconds on a busy CPU
CHECK_TIMEOUT_S = 10.0  # /health and /schema of a URL given in the config
STOP_GRACE_S = 5.0
DEATH_WAIT_S = 1.0  # a server whose connection failed and is not seen dead within this is taken as alive


def app_module(env_id: str) -> str:
    """The module an OpenEnv package serves its app from: `openenv-calc` -> `openenv_calc.server.app`."""
    return f"{env_id.replace('-', '_').lower()}.server.app"


def check_package(env_id: str) -> None:
    """EnvError unless the package `env_id` is installed with a `server/app.py`; imports no app."""
    module = app_module(env_id)
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        found = False
    except Exception as e:  # noqa: BLE001 - the package's own __init__ failed
        raise EnvError(f"OpenEnv environment '{env_id}' failed to import: {type(e).__name__}: {e}") from None
    if not found:
        raise EnvError(f"OpenEnv environment '{env_id}' is not installed: no module {module} (install the package "
                       f"that serves it, e.g. `uv pip install -e environments/{env_id}`, or give its server's url)")


@dataclass(frozen=True)
class Schemas:
    """The observation schemas a server publishes at /schema: reset's and a step's."""

    reset: Draft202012Validator
    step: Draft202012Validator

    @classmethod
    def of(cls, body: Any) -> Schemas:
        if not isinstance(body, dict) or not isinstance(body.get("observation"), dict):
            raise ValueError("/schema has no observation schema")
        return cls(Draft202012Validator(body.get("reset_observation") or body["observation"]),
                   Draft202012Validator(body["observation"]))

    @staticmethod
    def problem(validator: Draft202012Validator, observation: Any) -> str | None:
        """Why `observation` does not match, in one line; None when it does."""
        error = next(iter(validator.iter_errors(observation)), None)
        return None if error is None else " ".join(error.message.split())[:300]


def fetch_schemas(url: str, timeout_s: float = CHECK_TIMEOUT_S) -> Schemas:
    """/health then /schema of a server; EnvError in one line when either does not answer as OpenEnv does."""
    for route in ("/health", "/schema"):
        try:
            r = httpx.get(url.rstrip("/") + route, timeout=timeout_s)
            r.raise_for_status()
            body = r.json()
        except (httpx.HTTPError, ValueError) as e:
            raise EnvError(f"{url} does not answer {route} as an OpenEnv server: {type(e).__name__}: "
                           f"{' '.join(str(e).split()) or 'no message'}") from None
    try:
        return Schemas.of(body)
    except Exception as e:  # noqa: BLE001 - a schema the validator cannot read
        raise EnvError(f"{url}/schema is not a usable OpenEnv schema: {e}") from None


@dataclass
class Server:
    url: str
    port: int | None = None  # started here: its port (kept across restarts)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def dead(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None


@dataclass
class Slot:
    """One session's place on a server, and its WebSocket while it is open."""

    server: Server
    ws: Any = None
    tools: list[dict] | None = None  # the open session's tools, listed at its first episode


class Servers:
    """The servers of one environment and their session slots."""

    def __init__(self, env_id: str, url: str | None, servers: int, sessions: int, log_dir: Path) -> None:
        self.env_id, self.given_url, self.count, self.sessions, self.log_dir = env_id, url, servers, sessions, log_dir
        self.servers: list[Server] = []
        self.schemas: Schemas | None = None
        self.restarts = 0
        self._slots: asyncio.Queue[Slot] | None = None
        self._all: list[Slot] = []

    def check(self) -> None:
        """What `--dry-run` and the start check: the package is installed, or the URL answers."""
        if self.given_url is not None:
            self.schemas = fetch_schemas(self.given_url)
        else:
            check_package(self.env_id)

    async def start(self) -> None:
        self.check()
        if self.given_url is not None:
            self.servers = [Server(self.given_url.rstrip("/"))]
        else:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self.servers = [Server(f"http://127.0.0.1:{port}", port, log_path=self.log_dir / f"openenv-{self.env_id}-{k}.log")
                            for k, port in enumerate(free_port() for _ in range(self.count))]
            try:
                await asyncio.gather(*(self._spawn(s) for s in self.servers))
            except BaseException:
                self.stop()
                raise
            self.schemas = await asyncio.to_thread(fetch_schemas, self.servers[0].url)
            log.info(f"{self.env_id}: {len(self.servers)} OpenEnv server(s) of {self.sessions} session(s) each on "
                     f"{', '.join(s.url for s in self.servers)}")
        self._slots = asyncio.Queue()
        self._all = [Slot(s) for _ in range(self.sessions) for s in self.servers]  # round robin over the servers
        for slot in self._all:
            self._slots.put_nowait(slot)

    async def _spawn(self, s: Server) -> None:
        argv = [sys.executable, "-m", "uvicorn", f"{app_module(self.env_id)}:app", "--host", "127.0.0.1",
                "--port", str(s.port), "--log-level", "warning"]
        with open(s.log_path, "ab") as out:
            # in the orchestrator's process group, so a stop of the orchestrator's group reaches it
            s.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                      preexec_fn=die_with_parent())  # backstop if the orchestrator is SIGKILLed
        deadline = time.monotonic() + READY_TIMEOUT_S
        async with httpx.AsyncClient(timeout=2.0) as http:
            while time.monotonic() < deadline:
                if s.dead():
                    raise EnvError(f"OpenEnv environment '{self.env_id}': its server exited with code "
                                   f"{s.proc.returncode} before it was ready: {self._last_line(s)} (log: {s.log_path})")
                try:
                    if (await http.get(s.url + "/health")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                await asyncio.sleep(0.2)
        raise EnvError(f"OpenEnv environment '{self.env_id}': its server was not ready after {READY_TIMEOUT_S:.0f} s "
                       f"(log: {s.log_path})")

    @staticmethod
    def _last_line(s: Server) -> str:
        lines = [ln for ln in s.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else "(it printed nothing)"

    async def slot(self) -> Slot:
        """A session slot on one of the servers (waits while every slot is taken); give it back with `release`."""
        assert self._slots is not None, "start() first"
        return await self._slots.get()

    def release(self, slot: Slot) -> None:
        self._slots.put_nowait(slot)

    def open_sessions(self) -> list[Any]:
        return [slot.ws for slot in self._all if slot.ws is not None]

    async def recover(self, s: Server) -> bool:
        """Start `s` again if it was started here and has died (once, however many episodes found it
        dead); True when it is (again) up."""
        if s.proc is None:
            return False
        async with s.lock:
            if not s.dead():  # its connections close a moment before a killed process can be reaped
                try:
                    await asyncio.to_thread(s.proc.wait, DEATH_WAIT_S)
                except subprocess.TimeoutExpired:
                    return True  # alive: the connection failed on its own
            if s.dead():
                log.warning(f"{self.env_id}: the OpenEnv server on port {s.port} died (exit {s.proc.returncode}): "
                            "starting it again")
                try:
                    await self._spawn(s)
                except EnvError as e:  # the run goes on; the next episode that finds it dead tries again
                    log.warning(f"{self.env_id}: {e}")
                    return False
                self.restarts += 1
        return True

    def stop(self) -> None:
        for s in self.servers:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.terminate()
        for s in self.servers:
            if s.proc is None:
                continue
            try:
                s.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait()

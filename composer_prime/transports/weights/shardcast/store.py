"""A SHARDCAST data directory, as origin and relays keep it, and the async HTTP app serving it.

Layout (the `shardcast` package's, plus our signed manifest beside the shards):

    distribution.txt             "vN: <blake3 of payload>|<shard count>" per line, oldest first
    data1.bin                    a small file SHARDCAST clients download to probe a server
    vN/shard_00001.bin ...       the payload of step N, cut in shards
    vN/manifest.json, .sig       the trainer-signed manifest (ours; SHARDCAST ignores them)

Routes: every file above (GET/HEAD, byte ranges for resumed downloads), `/latest?after=N&wait=S`
(long-poll: answers as soon as a step newer than N is listed, or after S seconds), `/health`.
A shard of a listed step that has not arrived yet (a relay still fetching it) is waited for
rather than refused, so relays pass shards on as soon as they are verified.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import threading
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

DISTRIBUTION = "distribution.txt"
PROBE = "data1.bin"
MANIFEST, SIGNATURE = "manifest.json", "manifest.sig"
SERVED = re.compile(r"distribution\.txt|data1\.bin|v\d+/(shard_\d{5}\.bin|manifest\.json|manifest\.sig)")
LINE = re.compile(r"^v(\d+):\s*([0-9a-f]{64})\|(\d+)$")
SHARD_WAIT_S = 60.0
MAX_POLL_S = 60.0


def version_name(step: int) -> str:
    return f"v{step}"


def parse_distribution(text: str) -> dict[int, tuple[str, int]]:
    """{step: (payload blake3, shard count)}; lines that do not parse are ignored, as SHARDCAST does."""
    out = {}
    for line in text.splitlines():
        if m := LINE.match(line.strip()):
            out[int(m[1])] = (m[2], int(m[3]))
    return out


class Store:
    """One data directory. Writers call `changed()` after changing it; the HTTP handlers wait on that."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.root / PROBE).exists():
            (self.root / PROBE).write_bytes(b"\0" * 1024)
        self._cond: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- state on disk ----
    def distribution(self) -> dict[int, tuple[str, int]]:
        try:
            return parse_distribution((self.root / DISTRIBUTION).read_text())
        except FileNotFoundError:
            return {}

    def write_distribution(self, entries: dict[int, tuple[str, int]]) -> None:
        text = "".join(f"{version_name(s)}: {h}|{n}\n" for s, (h, n) in sorted(entries.items()))
        tmp = self.root / (DISTRIBUTION + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.root / DISTRIBUTION)  # readers never see half a file

    def latest(self) -> int:
        return max(self.distribution(), default=-1)

    def retain(self, keep: set[int]) -> None:
        """Delist and delete every step not in `keep` (delist first: no client starts on a deleted step)."""
        dist = self.distribution()
        self.write_distribution({s: v for s, v in dist.items() if s in keep})
        for p in self.root.glob("v*"):
            if p.is_dir() and re.fullmatch(r"v\d+", p.name) and int(p.name[1:]) not in keep:
                shutil.rmtree(p, ignore_errors=True)

    # ---- change notification (any thread) ----
    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop, self._cond = loop, asyncio.Condition()

    def changed(self) -> None:
        if self._loop is None:
            return
        try:
            in_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            in_loop = False
        if in_loop:
            self._loop.create_task(self._wake())
        else:  # the trainer's thread publishing to the origin's server thread
            asyncio.run_coroutine_threadsafe(self._wake(), self._loop)

    async def _wake(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    async def wait_for(self, predicate, timeout: float) -> bool:
        try:
            async with self._cond:
                await asyncio.wait_for(self._cond.wait_for(predicate), timeout)
            return True
        except asyncio.TimeoutError:
            return predicate()


def build_app(store: Store, name: str = "shardcast") -> Starlette:
    root = store.root

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette):
        store.bind(asyncio.get_running_loop())  # writers in other threads wake waiters through this loop
        yield

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok", "role": name, "latest": store.latest()})

    async def latest(request: Request) -> Response:
        after = int(request.query_params.get("after", -1))
        wait = min(float(request.query_params.get("wait", 0)), MAX_POLL_S)
        await store.wait_for(lambda: store.latest() > after, wait)
        return JSONResponse({"latest": store.latest(), "steps": sorted(store.distribution())})

    async def file(request: Request) -> Response:
        rel = request.path_params["path"]
        if not SERVED.fullmatch(rel):  # only the layout above: never .part files, work dirs or keys
            return PlainTextResponse("not found", status_code=404)
        path = root / rel
        if not path.is_file():
            m = re.fullmatch(r"v(\d+)/shard_(\d{5})\.bin", rel)
            listed = store.distribution().get(int(m[1])) if m else None
            if not (listed and 1 <= int(m[2]) <= listed[1]):
                return PlainTextResponse("not found", status_code=404)
            if not await store.wait_for(path.is_file, SHARD_WAIT_S):  # listed but still arriving on this relay
                return PlainTextResponse("shard not available yet", status_code=503)
        if rel == DISTRIBUTION:
            body = path.read_bytes()
            etag = f'"{hashlib.sha256(body).hexdigest()[:16]}"'
            if request.headers.get("if-none-match") == etag:
                return Response(status_code=304, headers={"etag": etag})
            return Response(body, media_type="text/plain", headers={"etag": etag, "cache-control": "no-cache"})
        return FileResponse(path, media_type="application/octet-stream")

    return Starlette(routes=[Route("/health", health), Route("/latest", latest),
                             Route("/{path:path}", file, methods=["GET", "HEAD"])], lifespan=lifespan)


class ServerThread:
    """Serve a Store from a background thread (the origin inside the trainer process)."""

    def __init__(self, store: Store, host: str, port: int, name: str) -> None:
        config = uvicorn.Config(build_app(store, name), host=host, port=port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"{name}-http", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        self.thread.start()
        for _ in range(int(timeout * 20)):
            if self.server.started:
                return
            if not self.thread.is_alive():
                raise RuntimeError(f"{self.thread.name} failed to start (port in use?)")
            threading.Event().wait(0.05)
        raise RuntimeError(f"{self.thread.name} did not start in {timeout:.0f}s")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

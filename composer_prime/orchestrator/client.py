"""Async client for the inference server's token and score routes, spread over a pool of nodes
(orchestrator/pool.py: the run's own servers, and nodes that join).

aiohttp, not httpx: a step sends a whole batch of requests at once (128 in the quickstart), and
httpx's connection pool re-examines every connection on every request (`has_expired`,
`_assign_requests_to_connections`): profiled, that was about half of the orchestrator's CPU time;
aiohttp sends the same 128 requests with a fifth of the CPU or less. On a machine where the
orchestrator shares cores with inference and the trainer, that is step time.

Fewer requests still: a group's G rollouts ask for the same prompt at once, with consecutive
seeds. `generate` calls made in the same turn of the event loop with the same prompt and
parameters are sent as one request for n completions (the server's choice i samples with
seed + i, so each caller gets exactly what its own request would have). On the quickstart
that is 16 requests a step instead of 128.

Kept-alive connections: a server closes one that sat idle past its keep-alive timeout (uvicorn,
hence vLLM and our server: 5 s), and a request sent on it as it closes fails with "Server
disconnected" although the server is fine (seen once in a 100-step vLLM-CPU quickstart, where a
weight reload leaves connections idle). So the pool drops connections idle for 3 s, before any
such server would, and a request whose connection drops is sent again (twice at most: a seeded
request gets the same answer, an unseeded one a fresh sample). A server still unreachable after
that is `InferenceUnreachable`: the orchestrator stops with one line naming the server; so is a
request or health check unanswered for `inference_timeout_s` (a host cut off the network).

Nodes that join (a volunteer's: volunteer/node.py) are `Node`s of the same pool: the client asks
whichever node it picks for the group's completions and knows nothing more of it. A node that
cannot answer this request (`NodeFailed`: a lease lost, a submission no trusted server can check)
hands it to the next node. `audit` is the trusted servers' measurement of an untrusted node's
completion, handed to whoever validates them (volunteer/validator.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import aiohttp

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.audit import AuditAnswer, AuditRefused, AuditRequest
from composer_prime.contract.inference import Completion, Scores
from composer_prime.orchestrator.pool import HttpNode, NodeFailed, NodePool
from composer_prime.utils.progress import StillWaiting


class RefusedRequest(ValueError):
    """The server answered 4xx: this request is wrong (too long a context, a bad argument)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class InferenceUnreachable(RuntimeError):
    """No inference server answers (refused, or dropped the connection on every attempt)."""


KEEPALIVE_S = 3.0  # below uvicorn's 5 s: the pool never reuses a connection the server may be closing
RETRY_DELAYS_S = (0.2, 1.0)  # after a dropped or refused connection; then the error stands


class InferenceClient:
    def __init__(self, urls: list[str], model: str, timeout_s: float = 300.0) -> None:
        self.urls, self.model, self.timeout_s = urls, model, timeout_s  # the trusted servers
        self.pool = NodePool([HttpNode(u, model, self._post) for u in urls])  # they, and the nodes that join
        self._session: aiohttp.ClientSession | None = None  # made in the event loop that uses it
        self._pending: dict[tuple, list[tuple[int | None, asyncio.Future]]] = {}  # same prompt and params: seeds waiting
        self._sending: set[asyncio.Task] = set()  # the loop holds tasks weakly
        self.requests = 0  # generate requests sent (after coalescing)
        self.served = 0  # the newest weight version a trusted server answered with (leases use it)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:  # limit=0: the whole batch at once
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                                  connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S))
        return self._session

    async def _post(self, route: str, body: dict, url: str | None = None) -> dict[str, Any]:
        url, delays = url or self.pool.pick(trusted=True).name, list(RETRY_DELAYS_S)
        while True:
            try:
                async with self._http().post(f"{url}{route}", json=body) as r:
                    if 400 <= r.status < 500:
                        raise RefusedRequest(f"{route}: {r.status} {await r.text()}", r.status)
                    r.raise_for_status()
                    return await r.json()
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:  # dropped or refused connection
                if not delays:
                    raise InferenceUnreachable(f"inference at {url} is unreachable: {route} failed "
                                               f"{len(RETRY_DELAYS_S) + 1} times ({e!r})") from None
                await asyncio.sleep(delays.pop(0))
            except asyncio.TimeoutError:  # no answer at all: a host cut off, a server stopped
                raise InferenceUnreachable(self._silent(url, route)) from None

    def _silent(self, url: str, route: str) -> str:
        return f"inference at {url} did not answer {route} in {self.timeout_s:g} s (orchestrator.inference_timeout_s)"

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        key = (tuple(prompt_ids), sampling.model_copy(update={"seed": None}))
        if key not in self._pending:
            self._pending[key] = []
            asyncio.get_running_loop().call_soon(self._flush, key)  # after every caller already scheduled this turn
        future = asyncio.get_running_loop().create_future()
        self._pending[key].append((sampling.seed, future))
        return await future

    def _flush(self, key: tuple) -> None:
        """Runs of consecutive seeds (or of no seed) become one request each."""
        waiting = sorted(self._pending.pop(key), key=lambda w: (w[0] is None, w[0] or 0))
        runs: list[list[tuple[int | None, asyncio.Future]]] = []
        for seed, future in waiting:  # seeded first, ascending; then the unseeded, which all join one run
            last = runs[-1][-1][0] if runs else None
            if runs and (seed is None if last is None else seed == last + 1):
                runs[-1].append((seed, future))
            else:
                runs.append([(seed, future)])
        for run in runs:
            task = asyncio.ensure_future(self._send(list(key[0]), key[1].model_copy(update={"seed": run[0][0]}),
                                                    [f for _, f in run]))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, prompt_ids: list[int], sampling: SamplingParams, futures: list[asyncio.Future]) -> None:
        self.requests += 1
        try:
            while True:
                node = self.pool.pick()
                try:
                    out = await node.complete(prompt_ids, sampling, len(futures))
                    break
                except InferenceUnreachable as e:
                    if node.trusted:
                        raise
                    self.pool.leave(node.name, str(e))  # an untrusted node gone: the others take its requests
                except NodeFailed:
                    continue  # the node's own bookkeeping let it go if it is gone; the task goes to the next node
        except asyncio.CancelledError:
            for f in futures:
                f.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - every caller of this request gets its error
            for f in futures:
                if not f.done():
                    f.set_exception(e)
            return
        for f, completion in zip(futures, out):
            if not f.done():  # a caller cancelled meanwhile
                f.set_result(dataclasses.replace(completion, node=node.name))

    async def audit(self, request: AuditRequest) -> AuditAnswer | None:
        """A trusted server's measurements of an untrusted node's completion (/inference/v1/audit): None
        when none serves the submission's weights any more; AuditRefused when it cannot measure it."""
        for url in self.urls:  # any trusted server at the submission's version will do
            try:
                return AuditAnswer.model_validate(await self._post("/inference/v1/audit", request.model_dump(mode="json"), url))
            except RefusedRequest as e:
                if e.status != 409:
                    raise AuditRefused(str(e)) from None
        return None

    async def score(self, token_ids: list[int], start: int, top_k: int, temperature: float = 1.0) -> Scores:
        """Top-k next-token log-probs at each position from `start` on (see `Engine.score`)."""
        return Scores(**await self._post("/inference/v1/score", {"token_ids": token_ids, "start": start, "top_k": top_k,
                                                                 "temperature": temperature}))

    async def versions(self) -> list[int]:
        out = []
        for url in self.urls:
            try:
                async with self._http().get(f"{url}/health") as r:
                    r.raise_for_status()
                    health = await r.json()
            except asyncio.TimeoutError:
                raise InferenceUnreachable(self._silent(url, "/health")) from None
            out.append(int(health["weight_version"]))
        self.served = max(out)
        return out

    async def wait_ready(self, timeout_s: float = 900.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            try:
                await self.versions()
                return
            except (aiohttp.ClientError, OSError, InferenceUnreachable):
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError(f"inference at {self.urls} not ready after {timeout_s:.0f}s") from None
                await asyncio.sleep(1.0)

    async def wait_version(self, minimum: int, timeout_s: float = 1800.0,
                           interrupt: Callable[[], bool] = lambda: False) -> int | None:
        """Block until every server serves at least `minimum`; returns the oldest served version, or
        None as soon as `interrupt()` is true (the version may never come: e.g. the trainer restarted)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        waiting = StillWaiting(f"weights v{minimum} from the trainer")
        while True:
            oldest = min(await self.versions())
            if oldest >= minimum:
                return oldest
            waiting.tick(f"inference serves v{oldest}")
            if interrupt():
                return None
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"inference still at weights v{oldest}, needed v{minimum}: is the trainer alive?")
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

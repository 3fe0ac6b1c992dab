"""The volunteer pool: untrusted workers join the run, beat, take leases, submit (issue 27).

An HTTP server in the orchestrator's event loop (`orchestrator.volunteers`, 127.0.0.1:8600 by
default; beyond loopback only with `auth.keys_dir`, as every process). Routes, every body signed
by the node's ed25519 key (contract/volunteer.py):

    POST /pool/join       hello + a join token            -> the model, `volunteers.dtype`, where the weights are, the beat period
    POST /pool/heartbeat  hello                          -> 200, or 403 once the node is dead or ejected
    POST /pool/lease      hello                          -> a Lease chosen by the pool, or 204 after `wait_s`
    POST /pool/submit     Submission                     -> 202 received, 410 late, 403 unknown

A joined node is a node of the client's NodePool (`volunteer:<id>`): when the client picks it,
`complete` leases it one task per completion (prompt, sampling parameters, seed: the node picks
nothing) and waits for its submissions; each goes through the validator (filters/volunteers.py)
before the rollout sees it. A node that misses `dead_after` beats is dead: its leases fail at
once and their tasks go to other nodes; a submission after its deadline is discarded (410). Each
node has a token bucket (`rate` per second, `burst`): beyond it, 429.

Who may join: a worker with an invite's token (volunteer/invites.py: one per volunteer, issued by
the operator), every key that joined with it that volunteer's, at most `keys_per_invite` of them;
or, in an open run only (`volunteers.open`), anyone with the run's one token, at most
`members_per_address` nodes per source address and `join_rate` joins per second from one. The
member table holds at most `max_members` (the longest-silent dead node makes room; else 403).
Ejecting a node revokes its invite and ejects every key that joined with it.

Misbehaviour is charged in strikes (config/volunteers.py: a failed check 1, a lease whose deadline
passed or a node that fell silent holding it `strike_missed` each, a submission checked too late
`strike_unverifiable`), each accepted submission takes `strike_decay` off; at `eject_after` the node
is ejected and its key refused from then on (the run's own list). A node's record outlives its
death: one that falls silent and joins again keeps its strikes. A new node is on probation, one
request in flight (`probation_requests`), until `probation_accepted` submissions are accepted: a
request beyond that goes to another node.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from composer_prime.config.sampling import SamplingParams
from composer_prime.config.volunteers import VolunteersConfig
from composer_prime.contract.volunteer import Lease, Submission, hello_valid
from composer_prime.orchestrator.pool import NodePool
from composer_prime.volunteer.invites import InviteError, Invites
from composer_prime.volunteer.replays import Replays
from composer_prime.volunteer.tls import split_token

log = logging.getLogger(__name__)
PREFIX = "volunteer:"  # a volunteer's name in the NodePool
EJECTED_KEPT = 65_536  # ejected keys remembered (an invite's revocation outlives them)
JOIN_BUCKETS_KEPT = 4_096  # source addresses whose join rate is tracked


class LeaseLost(RuntimeError):
    """The node died, was ejected or missed the deadline: the task goes to another node."""


class Unverifiable(RuntimeError):
    """No trusted server holds the weights a submission used: not the node's fault, not used."""


@dataclass
class Member:
    node_id: str
    last_beat: float
    status: str = "healthy"  # healthy | dead | ejected
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    tokens: float = 0.0  # the rate limit's bucket
    refilled: float = 0.0
    invite: str = ""  # the invite it joined with ("" in an open run)
    address: str = ""  # the source address of its join
    counts: Counter = field(default_factory=Counter)  # leased, accepted, rejected:<why>, late, limited, ...
    strikes: float = 0.0  # charged misbehaviour, less what accepted work took off
    in_flight: int = 0  # requests (a group's leases each) the client has given it now


@dataclass
class Pending:
    lease: Lease
    node_id: str
    future: asyncio.Future


class VolunteerPool:
    def __init__(self, cfg: VolunteersConfig, nodes: NodePool, token: str | None, weights: dict, model: str,
                 invites: Invites, tls: tuple[Path, Path] | None = None) -> None:
        """`token`: an open run's one token (None: invites only); `tls`: its (certificate, key), to serve HTTPS."""
        self.cfg, self.nodes, self.weights, self.model = cfg, nodes, weights, model
        self.token = None if token is None else split_token(token)[0]  # the secret; the pin is the worker's
        self.invites, self.tls, self.replays = invites, tls, Replays()
        self.members: dict[str, Member] = {}
        self.ejected: dict[str, None] = {}  # ordered: the oldest forgotten past EJECTED_KEPT
        self.joins: dict[str, tuple[float, float]] = {}  # source address -> its join bucket (tokens, when)
        self.pending: dict[str, Pending] = {}
        self.refused = Counter()  # requests refused before any node is known: unregistered, bad signature
        self._tasks: list[asyncio.Task] = []
        self._server: uvicorn.Server | None = None

    # -- the run's side ---------------------------------------------------------------------
    async def start(self) -> None:
        cert, key = self.tls or (None, None)
        self._server = uvicorn.Server(uvicorn.Config(self.app(), host=self.cfg.host, port=self.cfg.port,
                                                     log_level="warning", ssl_certfile=cert, ssl_keyfile=key))
        self._tasks = [asyncio.create_task(self._server.serve()), asyncio.create_task(self._watch())]
        while not self._server.started:
            if self._tasks[0].done():  # the port was taken: its exception says so
                self._tasks[0].result()
                raise RuntimeError(f"the volunteer pool could not listen on {self.cfg.host}:{self.cfg.port}")
            await asyncio.sleep(0.05)
        log.info(f"volunteer pool on {'https' if self.tls else 'http'}://{self.cfg.host}:{self.cfg.port}")

    async def stop(self) -> None:
        if self._server is not None:
            # the run is over: no need to wait out the workers' long polls for leases (up to `wait_s` each),
            # which uvicorn's graceful shutdown would; they hear that the pool is gone
            self._server.should_exit = self._server.force_exit = True
        for t in self._tasks[1:]:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def lease(self, url: str, prompt_ids: list[int], params: SamplingParams, weight_version: int,
                    env: str = "") -> tuple[Lease, Submission]:
        """Lease one generation to the node `url` (`volunteer:<id>`) and wait for its submission."""
        node = url.removeprefix(PREFIX)
        member = self.members.get(node)
        if member is None or member.status != "healthy":
            raise LeaseLost(f"node {node[:12]} is not healthy")
        lease = Lease(uuid.uuid4().hex, env, list(prompt_ids), params.model_dump(mode="json"), weight_version,
                      time.time() + self.cfg.lease_s)
        future = asyncio.get_running_loop().create_future()
        self.pending[lease.lease_id] = Pending(lease, node, future)
        member.queue.put_nowait(lease)
        member.counts["leased"] += 1
        try:
            return lease, await asyncio.wait_for(future, self.cfg.lease_s)
        except asyncio.TimeoutError:
            self.charge(node, "missed", self.cfg.strike_missed)
            raise LeaseLost(f"node {node[:12]} missed lease {lease.lease_id[:8]}'s deadline") from None
        finally:
            self.pending.pop(lease.lease_id, None)

    @contextlib.asynccontextmanager
    async def request(self, url: str):
        """One request's leases to the node `url`; a node on probation takes `probation_requests` at a
        time: another is LeaseLost at once (the client sends it to the next node)."""
        member = self.members.get(url.removeprefix(PREFIX))
        if member is None or member.status != "healthy":
            raise LeaseLost(f"node {url.removeprefix(PREFIX)[:12]} is not healthy")
        if self.on_probation(member) and member.in_flight >= self.cfg.probation_requests:
            raise LeaseLost(f"node {member.node_id[:12]} is on probation, with {member.in_flight} request(s) in flight")
        member.in_flight += 1
        try:
            yield
        finally:
            member.in_flight -= 1

    def on_probation(self, member: Member) -> bool:
        return member.counts["accepted"] < self.cfg.probation_accepted

    def verdict(self, node: str, reason: str) -> None:
        """The validator's word on one submission: "" accepted (`strike_decay` off its strikes), else a strike."""
        member = self.members.get(node)
        if member is None or member.status == "ejected":  # its verdicts after its ejection count no more
            return
        if reason:
            self.charge(node, f"rejected:{reason}", 1.0)
        else:
            member.counts["accepted"] += 1
            member.strikes = max(0.0, member.strikes - self.cfg.strike_decay)

    def charge(self, node: str, what: str, strikes: float, times: int = 1) -> None:
        """`times` counts of `what`, each `strikes`; at `eject_after` strikes the node is ejected."""
        member = self.members.get(node)
        if member is None or member.status == "ejected":
            return
        member.counts[what] += times
        member.strikes += strikes * times
        if member.strikes >= self.cfg.eject_after:
            self.eject(member, f"{member.strikes:g} strikes (last: {what})")

    def eject(self, member: Member, why: str) -> None:
        """Eject the node, revoke its invite and eject every other key that joined with it."""
        log.warning(f"volunteer {member.node_id[:12]} ejected: {why}")
        for m in [member] + [m for m in self.members.values() if member.invite and m.invite == member.invite and m is not member]:
            self.ejected[m.node_id] = None
            if m.status != "ejected":
                self._gone(m, "ejected")
        while len(self.ejected) > EJECTED_KEPT:  # an open run's Sybils come with fresh keys anyway
            del self.ejected[next(iter(self.ejected))]
        if member.invite:
            self.invites.revoke(member.invite, f"node {member.node_id[:12]} ejected: {why}")

    def is_member(self, node: str) -> bool:
        return (m := self.members.get(node)) is not None and m.status == "healthy"

    def metrics(self) -> dict[str, float]:
        """Per node (by the first 12 hex digits of its id) and in all."""
        out: dict[str, float] = {"volunteers/healthy": sum(m.status == "healthy" for m in self.members.values()),
                                 "volunteers/ejected": len(self.ejected)}
        out |= {f"volunteers/refused/{k}": v for k, v in self.refused.items()}
        out["volunteers/probation"] = sum(m.status == "healthy" and self.on_probation(m) for m in self.members.values())
        for m in self.members.values():
            out |= {f"volunteers/{m.node_id[:12]}/{k}": v for k, v in m.counts.items()}
            out[f"volunteers/{m.node_id[:12]}/strikes"] = m.strikes
        return out

    def in_batch(self, nodes: list[list[str]]) -> dict[str, int]:
        """Rollouts in a batch that a volunteer sampled a turn of (`nodes`: each rollout's), per volunteer."""
        out = {f"volunteers/{m.node_id[:12]}/in_batch": 0 for m in self.members.values()}
        for rollout in nodes:
            for n in {n for n in rollout if n.startswith(PREFIX)}:
                key = f"volunteers/{n[len(PREFIX):][:12]}/in_batch"
                out[key] = out.get(key, 0) + 1
        return out

    def _gone(self, member: Member, status: str) -> None:
        """The node leaves the NodePool; its leases in flight fail at once (a silent node is charged for them)."""
        member.status = status
        self.nodes.leave(PREFIX + member.node_id, status)
        held = [p for p in self.pending.values() if p.node_id == member.node_id and not p.future.done()]
        for p in held:
            p.future.set_exception(LeaseLost(f"node {member.node_id[:12]} is {status}"))
        if held and status == "dead":
            self.charge(member.node_id, "reassigned", self.cfg.strike_missed, len(held))
        elif held:
            member.counts["reassigned"] += len(held)

    async def _watch(self) -> None:
        """Every beat period: a node silent for `dead_after` periods is dead."""
        while True:
            await asyncio.sleep(self.cfg.heartbeat_s)
            now = time.time()
            for m in list(self.members.values()):
                if m.status == "healthy" and now - m.last_beat > self.cfg.dead_after * self.cfg.heartbeat_s:
                    log.warning(f"volunteer {m.node_id[:12]} missed {self.cfg.dead_after} heartbeats: dead, "
                                f"its leases go to other nodes")
                    self._gone(m, "dead")

    # -- the nodes' side ----------------------------------------------------------------------
    def _member(self, body: dict, route: str) -> Member:
        """The healthy member who signed `body` for `route`, within its rate; else the HTTP error."""
        node = str(body.get("node_id", ""))
        member = self.members.get(node)
        if member is not None:
            self._limit(member)
            if member.invite and member.status != "ejected" and self._revoked(member.invite):
                self.eject(member, "its invite was revoked")
        if not hello_valid(body, route):
            self.refused["bad_signature"] += 1
            raise HTTPException(403, "bad or stale signature")
        self._once(body)
        if node in self.ejected:
            self.refused["ejected"] += 1
            raise HTTPException(403, "this node was ejected from the run")
        if member is None or member.status != "healthy":
            self.refused["unregistered"] += 1
            raise HTTPException(403, "not a member of the pool: join first")
        return member

    def _limit(self, member: Member) -> None:
        now = time.time()
        member.tokens = min(self.cfg.burst, member.tokens + (now - member.refilled) * self.cfg.rate)
        member.refilled = now
        if member.tokens < 1:
            member.counts["limited"] += 1
            raise HTTPException(429, f"more than {self.cfg.rate:g} requests/s")
        member.tokens -= 1

    def _once(self, hello: dict) -> None:
        """A signed hello is good once (volunteer/replays.py): a copy, replayed from the path, is refused."""
        if not self.replays.first_use(hello):
            self.refused["replayed"] += 1
            raise HTTPException(403, "this hello was used already (a replay)")

    def _admit(self, token: str) -> str:
        """The invite `token` belongs to ("" for an open run's token); else 403."""
        token = split_token(token)[0]
        if self.token is not None and hmac.compare_digest(token.encode(), self.token.encode()):
            return ""
        try:
            found = self.invites.find(token)
        except InviteError as e:  # the operator's file is broken: say so, refuse the join, keep the run
            log.error(f"volunteers: {e}")
            raise HTTPException(503, "the run cannot read its invites") from None
        if found is None:
            self.refused["bad_token"] += 1
            raise HTTPException(403, "wrong join token")
        name, entry = found
        if entry.get("revoked"):
            self.refused["revoked"] += 1
            raise HTTPException(403, f"this invite was revoked: {entry['revoked']}")
        return name

    def _revoked(self, invite: str) -> bool:
        try:
            return bool(self.invites.table().get(invite, {}).get("revoked"))
        except InviteError:  # a broken file revokes no one (its joins are refused meanwhile)
            return False

    def _room_for(self, invite: str, address: str) -> None:
        """A new member within the bounds (module docstring); else 403."""
        live = [m for m in self.members.values() if m.status != "ejected"]
        if invite and sum(m.invite == invite for m in live) >= self.cfg.keys_per_invite:
            self.refused["keys_per_invite"] += 1
            raise HTTPException(403, f"this invite has {self.cfg.keys_per_invite} nodes already")
        if not invite and sum(m.address == address for m in live) >= self.cfg.members_per_address:
            self.refused["members_per_address"] += 1
            raise HTTPException(403, f"{self.cfg.members_per_address} nodes from this address already")
        if len(self.members) >= self.cfg.max_members:
            gone = [m for m in self.members.values() if m.status != "healthy"]
            if not gone:
                self.refused["full"] += 1
                raise HTTPException(403, f"the pool is full ({self.cfg.max_members} nodes)")
            del self.members[min(gone, key=lambda m: m.last_beat).node_id]  # its ejection, if any, stays in `ejected`

    def _limit_joins(self, address: str) -> None:
        """`join_rate` joins per second from one address (a bucket of `join_burst`): a join costs a
        signature check and, in an open run, a member; unknown nodes have no bucket of their own."""
        now = time.time()
        tokens, then = self.joins.get(address, (float(self.cfg.join_burst), now))
        tokens = min(self.cfg.join_burst, tokens + (now - then) * self.cfg.join_rate)
        if tokens < 1:
            self.refused["join_limited"] += 1
            raise HTTPException(429, f"more than {self.cfg.join_rate:g} joins/s from this address")
        self.joins.pop(address, None)
        self.joins[address] = (tokens - 1, now)
        while len(self.joins) > JOIN_BUCKETS_KEPT:  # the oldest address forgotten: bounded like every table here
            del self.joins[next(iter(self.joins))]

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/pool/join")
        async def join(request: Request) -> dict:
            address = request.client.host if request.client else ""
            self._limit_joins(address)
            body = await request.json()
            invite = self._admit(str(body.get("token", "")))
            node = str(body.get("node_id", ""))
            if node in self.ejected:
                self.refused["ejected"] += 1
                raise HTTPException(403, "this node was ejected from the run")
            if not hello_valid(body, "join"):
                self.refused["bad_signature"] += 1
                raise HTTPException(403, "bad or stale signature")
            self._once(body)
            member = self.members.get(node)
            if member is not None and member.invite != invite:
                self.refused["other_invite"] += 1
                raise HTTPException(403, "this node joined with another invite")
            if member is None:
                self._room_for(invite, address)
                self.members[node] = member = Member(node, time.time(), tokens=self.cfg.burst, refilled=time.time(),
                                                     invite=invite, address=address)
            if member.status != "healthy" or PREFIX + node not in self.nodes.nodes:  # new, or back: its record kept
                member.status = "healthy"
                self.nodes.join(PREFIX + node)
                log.info(f"volunteer {node[:12]} joined")
            member.last_beat = time.time()
            return {"model": self.model, "weights": self.weights, "heartbeat_s": self.cfg.heartbeat_s, "dtype": self.cfg.dtype}

        @app.post("/pool/heartbeat")
        async def heartbeat(request: Request) -> dict:
            member = self._member(await request.json(), "heartbeat")
            member.last_beat = time.time()
            return {"status": member.status}

        @app.post("/pool/lease")
        async def lease(request: Request) -> Response:
            body = await request.json()
            member = self._member(body, "lease")
            member.last_beat = time.time()  # asking for work is a sign of life too
            wait = min(float(body.get("wait_s", 10.0)), 30.0)
            try:
                while True:  # skip leases whose task already went elsewhere
                    lease = await asyncio.wait_for(member.queue.get(), wait)
                    if lease.lease_id in self.pending:
                        return JSONResponse(asdict(lease))
            except asyncio.TimeoutError:
                return Response(status_code=204)

        @app.post("/pool/submit")
        async def submit(request: Request) -> Response:
            body = await request.json()
            known = {f: body[f] for f in Submission.__dataclass_fields__ if isinstance(body, dict) and f in body}
            try:
                sub = Submission(**known)
            except TypeError as e:
                self.refused["malformed"] += 1
                raise HTTPException(422, f"not a submission: {e}") from None
            member = self.members.get(sub.node_id)
            if member is not None:
                self._limit(member)
            if not sub.signature_valid():
                self.refused["bad_signature"] += 1
                raise HTTPException(403, "bad signature")
            if member is None or member.status != "healthy":
                self.refused["ejected" if sub.node_id in self.ejected else "unregistered"] += 1
                raise HTTPException(403, "not a member of the pool")
            p = self.pending.get(sub.lease_id)
            if p is None or p.node_id != sub.node_id or p.future.done():
                member.counts["late"] += 1
                raise HTTPException(410, "no such lease in flight for this node (late, or reassigned)")
            if extra := sorted(set(body) - set(known)):  # a reward, say: a node reports none; its signed submission came with more
                p.future.set_exception(LeaseLost(f"node {sub.node_id[:12]} sent fields a submission has not: {extra}"))
                self.verdict(sub.node_id, "malformed")
                raise HTTPException(422, f"a submission has no {extra}: the run computes rewards itself")
            p.future.set_result(sub)
            return Response(status_code=202)

        return app


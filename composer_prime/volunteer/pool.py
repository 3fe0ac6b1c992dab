"""The volunteer pool, the run's side: untrusted workers join the run, beat, take leases, submit
(issue 27), and are charged for what they do wrong (issue 36).

A node source of the orchestrator's (orchestrator/pool.py, registered as `volunteers`): an HTTP
server in the orchestrator's event loop (`orchestrator.volunteers`, 127.0.0.1:8600 by default;
HTTPS beyond loopback, volunteer/tls.py), its routes in volunteer/door.py. A joined node is a
`VolunteerNode` in the client's NodePool (volunteer/node.py): when the client picks it, each
completion of the request becomes a lease (prompt, sampling parameters, seed: the node picks
nothing), and each submission goes through the validator (volunteer/validator.py) before the
rollout sees it. A node that misses `dead_after` beats is dead: its leases fail at once and their
tasks go to other nodes; a submission after its deadline is discarded (410).

Misbehaviour is charged in strikes to the volunteer (config/volunteers.py; every key of one invite
shares one record, volunteer/members.py): a failed check 1, since it costs its whole group; a lease
lost (its deadline passed, or its node fell silent holding it) `strike_missed` for each lease of the
request it belonged to, once per request, since the client sends all of that request again; a
submission checked too late `strike_unverifiable`. A group's worth of accepted submissions takes
`strike_decay` off, each its share, and never the `strike_kept` share of a rejection or a withheld
lease (issue 43: a veto or a partial hoard now and then, between honest groups, adds up). At
`eject_after` the node is ejected, its key refused from then on, its invite revoked and every other
key that joined with that invite ejected too. A node's record outlives its death: one that falls
silent and joins again keeps its strikes. A new node is on probation, one request in flight
(`probation_requests`), until `probation_accepted` submissions are accepted: a request beyond that
goes to another node.

The run's lines name a volunteer by invite and node (`my-laptop (3f2a9c1b4d5e)`), an ejected node is told
why, and every beat the pool writes its roster for the operator's commands (volunteer/roster.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import uvicorn

from composer_prime.config.models import OrchestratorConfig
from composer_prime.config.sampling import SamplingParams
from composer_prime.config.volunteers import VolunteersConfig
from composer_prime.contract.volunteer import Lease, Submission
from composer_prime.contract.weights import Directory, Shardcast, WeightsSource
from composer_prime.orchestrator.pool import Audit, NodePool
from composer_prime.transports import auth
from composer_prime.volunteer.door import Door
from composer_prime.volunteer.invites import InviteError, Invites, store_path
from composer_prime.volunteer.members import PREFIX, Held, LeaseLost, Member, Pending, Record
from composer_prime.volunteer.roster import NAME as ROSTER, Stopping, write_roster
from composer_prime.volunteer.tls import cert_dir, ensure_cert, pinned_token, split_token
from composer_prime.volunteer.validator import Validator

log = logging.getLogger(__name__)
EJECTED_KEPT = 65_536  # ejected keys remembered (an invite's revocation outlives them)
REQUEST: contextvars.ContextVar[Held | None] = contextvars.ContextVar("volunteer_request", default=None)  # `request`'s


class VolunteerPool:
    def __init__(self, cfg: VolunteersConfig, nodes: NodePool, token: str | None, weights: WeightsSource, model: str,
                 invites: Invites, tls: tuple[Path, Path] | None = None, group: int = 8) -> None:
        """`token`: an open run's one token (None: invites only); `tls`: its (certificate, key), to serve HTTPS;
        `group`: the run's group size (a group's worth of accepted work takes `strike_decay` off). The
        validator and `served` (the trusted servers' weight version) are set by `build`."""
        self.cfg, self.nodes, self.weights, self.model, self.group = cfg, nodes, weights, model, group
        self.token = None if token is None else split_token(token)[0]  # the secret; the pin is the worker's
        self.invites, self.tls = invites, tls
        self.members: dict[str, Member] = {}
        self.records: dict[str, Record] = {}  # invite -> its volunteer's record (the operator's invites: bounded)
        self.ejected: dict[str, str] = {}  # node -> why; ordered: the oldest forgotten past EJECTED_KEPT
        self.pending: dict[str, Pending] = {}
        self.refused = Counter()  # requests refused before any node is known: unregistered, bad signature
        self.validator: Validator | None = None
        self.served: Callable[[], int] = lambda: 0
        self.door = Door(self)
        self._tasks: list[asyncio.Task] = []
        self._server: uvicorn.Server | None = None
        self._stopping = Stopping()

    @classmethod
    def active(cls, cfg: OrchestratorConfig) -> bool:
        return cfg.volunteers.enabled

    @classmethod
    def build(cls, cfg: OrchestratorConfig, pool: NodePool, audit: Audit, served: Callable[[], int]) -> VolunteerPool:
        """The run's pool and its validator: the open run's token (made once per run directory, kept across
        restarts), the TLS certificate every token pins, where workers pull the weights from."""
        v = cfg.volunteers
        token, join = v.join_token, f"uv run worker --join {'https' if v.serves_tls() else 'http'}://{v.host}:{v.port} --token_file"
        if v.open and token is None:
            path = (cfg.auth.keys_dir or Path(cfg.output_dir) / "orchestrator") / "volunteers.token"
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(pinned_token(secrets.token_urlsafe(24), cfg.output_dir))
            token = path.read_text().strip()
            log.info(f"an open run: volunteers join with: {join} {path}")
        elif not v.open:
            log.info(f"volunteers join with an invite: uv run composer-prime volunteers invite NAME --run {cfg.output_dir} "
                     f"--out NAME.token, then {join} NAME.token")
        weights = (Shardcast(tuple(v.relays), auth.public_key(v.public_key)) if v.relays
                   else Directory(str(Path(cfg.output_dir).resolve() / "weights")))
        tls = ensure_cert(cert_dir(cfg.output_dir)) if v.serves_tls() else None
        out = cls(v, pool, token, weights, cfg.model, Invites(store_path(cfg.output_dir)), tls, cfg.group_size)
        out.validator, out.served = Validator(v, out.is_member, audit), served
        return out

    async def start(self) -> None:
        cert, key = self.tls or (None, None)
        # lifespan off: the door has no start-up or shutdown hooks, and a force_exit leaves the lifespan task to be
        # cancelled at the loop's end, whose traceback starlette hands uvicorn to log as an error
        self._server = uvicorn.Server(uvicorn.Config(self.door.app(), host=self.cfg.host, port=self.cfg.port, lifespan="off",
                                                     log_level="warning", ssl_certfile=cert, ssl_keyfile=key))
        logging.getLogger("uvicorn.error").addFilter(self._stopping)
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
            # which uvicorn's graceful shutdown would; they hear that the pool is gone. Cut, each poll's
            # cancellation is no error (Stopping); the filter stays: the loop's end cancels the last ones
            self._stopping.stopping = True
            self._server.should_exit = self._server.force_exit = True
        for t in self._tasks[1:]:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def lease(self, node: str, prompt_ids: list[int], params: SamplingParams, weight_version: int,
                    env: str = "") -> tuple[Lease, Submission]:
        """Lease one generation to the node `node` (its id) and wait for its submission."""
        member = self.members.get(node)
        if member is None or member.status != "healthy":
            raise LeaseLost(f"node {node[:12]} is not healthy")
        lease = Lease(uuid.uuid4().hex, env, list(prompt_ids), params.model_dump(mode="json"), weight_version,
                      time.time() + self.cfg.lease_s)
        future, held = asyncio.get_running_loop().create_future(), REQUEST.get()
        if held is not None:
            held.leases += 1
        self.pending[lease.lease_id] = Pending(lease, node, future, held)
        member.queue.put_nowait(lease)
        member.counts["leased"] += 1
        try:
            return lease, await asyncio.wait_for(future, self.cfg.lease_s)
        except asyncio.TimeoutError:  # withheld by a live node (one that fell silent fails at once, in `_gone`)
            self.lose(node, "missed", [held], kept=True)
            raise LeaseLost(f"node {node[:12]} missed lease {lease.lease_id[:8]}'s deadline") from None
        finally:
            self.pending.pop(lease.lease_id, None)

    @contextlib.asynccontextmanager
    async def request(self, node: str):
        """One request's leases to the node `node`; a node on probation takes `probation_requests` at a
        time: another is LeaseLost at once (the client sends it to the next node)."""
        member = self.members.get(node)
        if member is None or member.status != "healthy":
            raise LeaseLost(f"node {node[:12]} is not healthy")
        if self.on_probation(member) and member.in_flight >= self.cfg.probation_requests:
            raise LeaseLost(f"node {node[:12]} is on probation, with {member.in_flight} request(s) in flight")
        member.in_flight += 1
        token = REQUEST.set(Held())  # its leases (made in tasks that copy this context) know their request
        try:
            yield
        finally:
            member.in_flight -= 1
            with contextlib.suppress(ValueError):  # closed from another context (a cancelled task's cleanup)
                REQUEST.reset(token)

    def on_probation(self, member: Member) -> bool:
        return member.counts["accepted"] < self.cfg.probation_accepted

    def verdict(self, node: str, reason: str) -> None:
        """The validator's word on one submission: "" accepted (its share of `strike_decay` off, down to the
        record's floor), else a strike (its group is dropped: a group's worth), `strike_kept` of it for good."""
        member = self.members.get(node)
        if member is None or member.status == "ejected":  # its verdicts after its ejection count no more
            return
        if reason:
            self.charge(node, f"rejected:{reason}", 1.0, kept=True)
        else:
            member.counts["accepted"] += 1
            r = member.record
            r.strikes = max(r.floor, r.strikes - self.cfg.strike_decay / self.group)

    def charge(self, node: str, what: str, strikes: float, times: int = 1, kept: bool = False) -> None:
        """`times` counts of `what`, each `strikes` (`kept`: `strike_kept` of them beyond what accepted work
        takes off); at `eject_after` strikes the node's volunteer is ejected."""
        member = self.members.get(node)
        if member is not None and member.status != "ejected":
            member.counts[what] += times
            self._strike(member, what, strikes * times, kept)

    def lose(self, node: str, what: str, held: list[Held | None], kept: bool) -> None:
        """Leases of `node` lost (`held`: the request of each): each costs the run its whole request, sent
        again by the client, so the first lost of a request is charged `strike_missed` for every lease of it."""
        member, leases = self.members.get(node), 0
        for h in held:
            if h is None or not h.charged:
                leases += 1 if h is None else h.leases
            if h is not None:
                h.charged = True
        if member is not None and member.status != "ejected":
            member.counts[what] += len(held)
            self._strike(member, what, self.cfg.strike_missed * leases, kept)

    def _strike(self, member: Member, what: str, strikes: float, kept: bool) -> None:
        r = member.record
        r.strikes += strikes
        if kept:
            r.floor = min(r.strikes, r.floor + self.cfg.strike_kept * strikes)
        if r.strikes >= self.cfg.eject_after:
            self.eject(member, f"{r.strikes:g} strikes (last: {what})")

    def record(self, invite: str) -> Record:
        """The record a node joining with `invite` is charged on: its volunteer's, one per invite (an open run's
        node: a record of its own)."""
        return self.records.setdefault(invite, Record()) if invite else Record()

    def who(self, member: Member) -> str:
        """A volunteer as the run's lines name it: its invite and node ('my-laptop (3f2a9c1b4d5e)'), or an
        open run's node alone."""
        return f"{member.invite} ({member.node_id[:12]})" if member.invite else member.node_id[:12]

    def revocation(self, invite: str) -> str | None:
        """Why the operator revoked `invite` ('its invite was revoked: <why>'), None while it stands (or the
        invites file cannot be read: a broken file revokes no one, and refuses joins meanwhile)."""
        try:
            why = self.invites.table().get(invite, {}).get("revoked") if invite else None
        except InviteError:
            return None
        return f"its invite was revoked: {why}" if why else None

    def eject(self, member: Member, why: str) -> None:
        """Eject the node, revoke its invite and eject every other key that joined with it; each is told `why`."""
        log.warning(f"volunteer {self.who(member)} ejected: {why}")
        same = [m for m in self.members.values() if member.invite and m.invite == member.invite and m is not member]
        for m in [member, *same]:
            self.ejected[m.node_id] = why
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

    def waiting_for(self) -> str | None:
        """`wait_for` healthy volunteers before the first step: how many are missing, else None."""
        healthy = sum(m.status == "healthy" for m in self.members.values())
        return f"{self.cfg.wait_for} volunteers ({healthy} joined)" if healthy < self.cfg.wait_for else None

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
            self.lose(member.node_id, "reassigned", [p.held for p in held], kept=False)
        elif held:
            member.counts["reassigned"] += len(held)

    async def _watch(self) -> None:
        """Every beat period: a node silent for `dead_after` periods is dead, one whose invite the operator
        revoked is ejected (it would be at its next request), and the members are written for the operator."""
        while True:
            await asyncio.sleep(self.cfg.heartbeat_s)
            now = time.time()
            for m in list(self.members.values()):
                if m.status != "ejected" and (why := self.revocation(m.invite)):
                    self.eject(m, why)
                elif m.status == "healthy" and now - m.last_beat > self.cfg.dead_after * self.cfg.heartbeat_s:
                    log.warning(f"volunteer {self.who(m)} missed {self.cfg.dead_after} heartbeats: dead, "
                                f"its leases go to other nodes")
                    self._gone(m, "dead")
            with contextlib.suppress(OSError):  # the operator's view only: never the run's failure
                write_roster(self.invites.path.with_name(ROSTER), self.members.values(), self.cfg.heartbeat_s)


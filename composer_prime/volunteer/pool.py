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

Misbehaviour is charged in strikes (config/volunteers.py: a failed check 1, a lease whose deadline
passed or a node that fell silent holding it `strike_missed` each, a submission checked too late
`strike_unverifiable`), each accepted submission takes `strike_decay` off; at `eject_after` the node
is ejected, its key refused from then on, its invite revoked and every other key that joined with
that invite ejected too. A node's record outlives its death: one that falls silent and joins again
keeps its strikes. A new node is on probation, one request in flight (`probation_requests`), until
`probation_accepted` submissions are accepted: a request beyond that goes to another node.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from composer_prime.volunteer.invites import Invites, store_path
from composer_prime.volunteer.members import PREFIX, LeaseLost, Member, Pending
from composer_prime.volunteer.tls import cert_dir, ensure_cert, pinned_token, split_token
from composer_prime.volunteer.validator import Validator

log = logging.getLogger(__name__)
EJECTED_KEPT = 65_536  # ejected keys remembered (an invite's revocation outlives them)


class VolunteerPool:
    def __init__(self, cfg: VolunteersConfig, nodes: NodePool, token: str | None, weights: WeightsSource, model: str,
                 invites: Invites, tls: tuple[Path, Path] | None = None) -> None:
        """`token`: an open run's one token (None: invites only); `tls`: its (certificate, key), to serve HTTPS.
        The validator and `served` (the trusted servers' weight version) are set by `build`."""
        self.cfg, self.nodes, self.weights, self.model = cfg, nodes, weights, model
        self.token = None if token is None else split_token(token)[0]  # the secret; the pin is the worker's
        self.invites, self.tls = invites, tls
        self.members: dict[str, Member] = {}
        self.ejected: dict[str, None] = {}  # ordered: the oldest forgotten past EJECTED_KEPT
        self.pending: dict[str, Pending] = {}
        self.refused = Counter()  # requests refused before any node is known: unregistered, bad signature
        self.validator: Validator | None = None
        self.served: Callable[[], int] = lambda: 0
        self.door = Door(self)
        self._tasks: list[asyncio.Task] = []
        self._server: uvicorn.Server | None = None

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
        out = cls(v, pool, token, weights, cfg.model, Invites(store_path(cfg.output_dir)), tls)
        out.validator, out.served = Validator(v, out.is_member, audit), served
        return out

    async def start(self) -> None:
        cert, key = self.tls or (None, None)
        self._server = uvicorn.Server(uvicorn.Config(self.door.app(), host=self.cfg.host, port=self.cfg.port,
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

    async def lease(self, node: str, prompt_ids: list[int], params: SamplingParams, weight_version: int,
                    env: str = "") -> tuple[Lease, Submission]:
        """Lease one generation to the node `node` (its id) and wait for its submission."""
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
    async def request(self, node: str):
        """One request's leases to the node `node`; a node on probation takes `probation_requests` at a
        time: another is LeaseLost at once (the client sends it to the next node)."""
        member = self.members.get(node)
        if member is None or member.status != "healthy":
            raise LeaseLost(f"node {node[:12]} is not healthy")
        if self.on_probation(member) and member.in_flight >= self.cfg.probation_requests:
            raise LeaseLost(f"node {node[:12]} is on probation, with {member.in_flight} request(s) in flight")
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
        same = [m for m in self.members.values() if member.invite and m.invite == member.invite and m is not member]
        for m in [member, *same]:
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

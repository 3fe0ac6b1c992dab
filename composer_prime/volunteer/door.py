"""The volunteer pool's door: its HTTP routes and who gets through them (issue 27, issue 36).

Every body is signed by the node's ed25519 key (contract/volunteer.py); a signed hello is good once
(volunteer/replays.py):

    POST /pool/join       hello + a join token  -> JoinAnswer: the model, the dtype, where the weights are, the beat period
    POST /pool/heartbeat  hello                 -> 200, or 403 once the node is dead or ejected
    POST /pool/lease      hello                 -> a Lease chosen by the pool, or 204 after `wait_s`
    POST /pool/submit     Submission            -> 202 received, 410 late, 403 unknown

Who may join: a worker with an invite's token (volunteer/invites.py: one per volunteer, issued by
the operator), every key that joined with it that volunteer's, at most `keys_per_invite` of them;
or, in an open run only (`volunteers.open`), anyone with the run's one token, at most
`members_per_address` nodes per source address. Always at most `join_rate` joins per second from
one address, and `max_members` nodes in the table (the longest-silent dead node makes room; else
403). Each node has a token bucket (`rate` per second, `burst`): beyond it, 429. An invite revoked
by the operator ejects its nodes at their next request.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import asdict

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from composer_prime.contract.volunteer import JoinAnswer, Submission, hello_valid
from composer_prime.volunteer.invites import InviteError
from composer_prime.volunteer.members import PREFIX, LeaseLost, Member
from composer_prime.volunteer.node import VolunteerNode
from composer_prime.volunteer.replays import Replays
from composer_prime.volunteer.tls import split_token

log = logging.getLogger(__name__)
JOIN_BUCKETS_KEPT = 4_096  # source addresses whose join rate is tracked


class Door:
    def __init__(self, pool) -> None:
        """`pool`: the VolunteerPool (volunteer/pool.py) whose members it admits and answers."""
        self.pool, self.cfg = pool, pool.cfg
        self.replays = Replays()
        self.joins: dict[str, tuple[float, float]] = {}  # source address -> its join bucket (tokens, when)

    def refuse(self, why: str, status: int, detail: str):
        self.pool.refused[why] += 1
        raise HTTPException(status, detail)

    def member(self, body: dict, route: str) -> Member:
        """The healthy member who signed `body` for `route`, within its rate; else the HTTP error."""
        pool, node = self.pool, str(body.get("node_id", ""))
        member = pool.members.get(node)
        if member is not None:
            self.limit(member)
            if member.invite and member.status != "ejected" and self.revoked(member.invite):
                pool.eject(member, "its invite was revoked")
        if not hello_valid(body, route):
            self.refuse("bad_signature", 403, "bad or stale signature")
        self.once(body)
        if node in pool.ejected:
            self.refuse("ejected", 403, "this node was ejected from the run")
        if member is None or member.status != "healthy":
            self.refuse("unregistered", 403, "not a member of the pool: join first")
        return member

    def limit(self, member: Member) -> None:
        now = time.time()
        member.tokens = min(self.cfg.burst, member.tokens + (now - member.refilled) * self.cfg.rate)
        member.refilled = now
        if member.tokens < 1:
            member.counts["limited"] += 1
            raise HTTPException(429, f"more than {self.cfg.rate:g} requests/s")
        member.tokens -= 1

    def once(self, hello: dict) -> None:
        """A signed hello is good once: a copy, replayed from the path, is refused."""
        if not self.replays.first_use(hello):
            self.refuse("replayed", 403, "this hello was used already (a replay)")

    def admit(self, token: str) -> str:
        """The invite `token` belongs to ("" for an open run's token); else 403."""
        token = split_token(token)[0]
        if self.pool.token is not None and hmac.compare_digest(token.encode(), self.pool.token.encode()):
            return ""
        try:
            found = self.pool.invites.find(token)
        except InviteError as e:  # the operator's file is broken: say so, refuse the join, keep the run
            log.error(f"volunteers: {e}")
            raise HTTPException(503, "the run cannot read its invites") from None
        if found is None:
            self.refuse("bad_token", 403, "wrong join token")
        name, entry = found
        if entry.get("revoked"):
            self.refuse("revoked", 403, f"this invite was revoked: {entry['revoked']}")
        return name

    def revoked(self, invite: str) -> bool:
        try:
            return bool(self.pool.invites.table().get(invite, {}).get("revoked"))
        except InviteError:  # a broken file revokes no one (its joins are refused meanwhile)
            return False

    def room_for(self, invite: str, address: str) -> None:
        """A new member within the bounds (module docstring); else 403."""
        members, cfg = self.pool.members, self.cfg
        live = [m for m in members.values() if m.status != "ejected"]
        if invite and sum(m.invite == invite for m in live) >= cfg.keys_per_invite:
            self.refuse("keys_per_invite", 403, f"this invite has {cfg.keys_per_invite} nodes already")
        if not invite and sum(m.address == address for m in live) >= cfg.members_per_address:
            self.refuse("members_per_address", 403, f"{cfg.members_per_address} nodes from this address already")
        if len(members) >= cfg.max_members:
            gone = [m for m in members.values() if m.status != "healthy"]
            if not gone:
                self.refuse("full", 403, f"the pool is full ({cfg.max_members} nodes)")
            del members[min(gone, key=lambda m: m.last_beat).node_id]  # its ejection, if any, stays in `ejected`

    def limit_joins(self, address: str) -> None:
        """`join_rate` joins per second from one address (a bucket of `join_burst`): a join costs a
        signature check and, in an open run, a member; unknown nodes have no bucket of their own."""
        now = time.time()
        tokens, then = self.joins.pop(address, (float(self.cfg.join_burst), now))
        tokens = min(self.cfg.join_burst, tokens + (now - then) * self.cfg.join_rate)
        self.joins[address] = (tokens - 1 if tokens >= 1 else tokens, now)
        while len(self.joins) > JOIN_BUCKETS_KEPT:  # the oldest address forgotten: bounded like every table here
            del self.joins[next(iter(self.joins))]
        if tokens < 1:
            self.refuse("join_limited", 429, f"more than {self.cfg.join_rate:g} joins/s from this address")

    async def join(self, body: dict, address: str) -> dict:
        pool = self.pool
        self.limit_joins(address)
        invite = self.admit(str(body.get("token", "")))
        node = str(body.get("node_id", ""))
        if node in pool.ejected:
            self.refuse("ejected", 403, "this node was ejected from the run")
        if not hello_valid(body, "join"):
            self.refuse("bad_signature", 403, "bad or stale signature")
        self.once(body)
        member = pool.members.get(node)
        if member is not None and member.invite != invite:
            self.refuse("other_invite", 403, "this node joined with another invite")
        if member is None:
            self.room_for(invite, address)
            pool.members[node] = member = Member(node, time.time(), tokens=self.cfg.burst, refilled=time.time(),
                                                 invite=invite, address=address)
        if member.status != "healthy" or PREFIX + node not in pool.nodes.nodes:  # new, or back: its record kept
            member.status = "healthy"
            pool.nodes.join(VolunteerNode(node, pool))
            log.info(f"volunteer {node[:12]} joined")
        member.last_beat = time.time()
        return JoinAnswer(pool.model, pool.weights, self.cfg.heartbeat_s, self.cfg.dtype).to_json()

    async def submit(self, body: dict) -> Response:
        pool = self.pool
        known = {f: body[f] for f in Submission.__dataclass_fields__ if isinstance(body, dict) and f in body}
        try:
            sub = Submission(**known)
        except TypeError as e:
            self.refuse("malformed", 422, f"not a submission: {e}")
        member = pool.members.get(sub.node_id)
        if member is not None:
            self.limit(member)
        if not sub.signature_valid():
            self.refuse("bad_signature", 403, "bad signature")
        if member is None or member.status != "healthy":
            self.refuse("ejected" if sub.node_id in pool.ejected else "unregistered", 403, "not a member of the pool")
        p = pool.pending.get(sub.lease_id)
        if p is None or p.node_id != sub.node_id or p.future.done():
            member.counts["late"] += 1
            raise HTTPException(410, "no such lease in flight for this node (late, or reassigned)")
        if extra := sorted(set(body) - set(known)):  # a reward, say: a node reports none; its signed submission came with more
            p.future.set_exception(LeaseLost(f"node {sub.node_id[:12]} sent fields a submission has not: {extra}"))
            pool.verdict(sub.node_id, "malformed")
            raise HTTPException(422, f"a submission has no {extra}: the run computes rewards itself")
        p.future.set_result(sub)
        return Response(status_code=202)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/pool/join")
        async def join(request: Request) -> dict:
            return await self.join(await request.json(), request.client.host if request.client else "")

        @app.post("/pool/heartbeat")
        async def heartbeat(request: Request) -> dict:
            member = self.member(await request.json(), "heartbeat")
            member.last_beat = time.time()
            return {"status": member.status}

        @app.post("/pool/lease")
        async def lease(request: Request) -> Response:
            body = await request.json()
            member = self.member(body, "lease")
            member.last_beat = time.time()  # asking for work is a sign of life too
            wait = min(float(body.get("wait_s", 10.0)), 30.0)
            try:
                while True:  # skip leases whose task already went elsewhere
                    lease = await asyncio.wait_for(member.queue.get(), wait)
                    if lease.lease_id in self.pool.pending:
                        return JSONResponse(asdict(lease))
            except asyncio.TimeoutError:
                return Response(status_code=204)

        @app.post("/pool/submit")
        async def submit(request: Request) -> Response:
            return await self.submit(await request.json())

        return app

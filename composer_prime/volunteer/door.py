"""The volunteer pool's door: its HTTP routes and who gets through them (issue 27, issue 36).

Every body is signed by the node's ed25519 key (contract/volunteer.py); a signed hello is good once
(volunteer/replays.py):

    POST /pool/join       hello + a join token  -> JoinAnswer: the model, the dtype, where the weights are, the beat period
    POST /pool/heartbeat  hello                 -> 200, or 403 once the node is dead or ejected
    POST /pool/lease      hello                 -> a Lease chosen by the pool, or 204 after `wait_s`
    POST /pool/submit     Submission            -> 202 received, 410 late, 403 unknown, 422 malformed (a strike)

A body is read no further than its route's bound (a hello's, HELLO_MAX_BYTES; a submission's, an
honest one's for the longest lease seen in flight: 413 beyond) and parsed as strict JSON (400
otherwise) before anything reads it; a submission is then typed and bounded by its lease (issue 43).

Who may join: a worker with an invite's token (volunteer/invites.py: one per volunteer, issued by
the operator), every key that joined with it that volunteer's, at most `keys_per_invite` of them;
or, in an open run only (`volunteers.open`), anyone with the run's one token, at most
`members_per_address` nodes per source address. Always at most `join_rate` joins per second per
invite, or, for an open run's token and wrong tokens, from one source address (issue 43: strangers'
tokenless joins from a host no longer lock out an invited worker on it), and `max_members` nodes in
the table (the longest-silent dead node makes room; else 403). An invite revoked by the operator
ejects its nodes at their next request.

A request on the other routes is checked in the order of its cost, and nothing is spent on behalf
of a node before its signature is verified (issue 43): its node id and signature must be lowercase
hex of their exact lengths; a node that is not a healthy member is refused with no signature check
and nothing remembered; a member's hello is verified, then remembered (single use), and only then
spends the member's bucket (`rate` per second, `burst`: beyond it, 429). Every refusal spends a
bucket of its source address (`address_rate`, `address_burst`); once that is empty the address's
requests are answered 429 before any check, unless they name a healthy member (so a stranger on
its host cannot lock a member out; such a request costs one signature check).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
from dataclasses import asdict

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from composer_prime.contract.batches import SchemaError
from composer_prime.contract.volunteer import (JoinAnswer, hello_valid, loads, parse_submission, submission_max_bytes,
                                               submission_signed)
from composer_prime.volunteer.invites import InviteError
from composer_prime.volunteer.members import PREFIX, Buckets, LeaseLost, Member
from composer_prime.volunteer.node import VolunteerNode
from composer_prime.volunteer.replays import Replays
from composer_prime.volunteer.tls import split_token

log = logging.getLogger(__name__)
HELLO_MAX_BYTES = 16_384  # a hello's body (about 300 bytes, a join token included)
NODE_ID, SIGNATURE = re.compile("[0-9a-f]{64}"), re.compile("[0-9a-f]{128}")  # the only forms: ed25519, lowercase hex


class Door:
    def __init__(self, pool) -> None:
        """`pool`: the VolunteerPool (volunteer/pool.py) whose members it admits and answers."""
        self.pool, self.cfg = pool, pool.cfg
        self.longest = 0  # the most tokens a lease in flight has asked for (a submission's bound, `submit_limit`)
        self.replays = Replays(keys=2 * self.cfg.max_members)  # members' hellos only (`member`, `join`)
        self.joins = Buckets(self.cfg.join_rate, self.cfg.join_burst)  # "invite NAME" or "address A" -> joins
        self.refusals = Buckets(self.cfg.address_rate, self.cfg.address_burst)  # source address -> refusals

    def refuse(self, why: str, status: int, detail: str):
        self.pool.refused[why] += 1
        raise HTTPException(status, detail)

    def member(self, body: dict, route: str) -> Member:
        """The healthy member who signed `body` for `route`, within its rate; else the HTTP error. A node that
        is not a healthy member costs no signature check and leaves nothing remembered."""
        pool, node = self.pool, self.signer(body)
        member = pool.members.get(node)
        if member is not None and member.status != "ejected" and (why := pool.revocation(member.invite)):
            pool.eject(member, why)
        if node in pool.ejected:  # and why, in words: the worker says it (issue 46)
            self.refuse("ejected", 403, f"this node was ejected from the run: {pool.ejected[node]}")
        if member is None or member.status != "healthy":
            self.refuse("unregistered", 403, "not a member of the pool: join first")
        if not hello_valid(body, route):
            self.refuse("bad_signature", 403, "bad or stale signature")
        self.once(body)
        self.limit(member)  # its own bucket, once it is known to be its request
        return member

    def signer(self, body: object) -> str:
        """The node id `body` names, its node id and signature in their one form (lowercase hex of their exact
        lengths: hex in another case or with spaces decodes to the same bytes, so a copy re-cased was another
        string); else refused."""
        if not isinstance(body, dict):
            self.refuse("malformed", 422, f"a request body is a JSON object, not {type(body).__name__}")
        node, signature = body.get("node_id"), body.get("signature")
        if not isinstance(node, str) or not NODE_ID.fullmatch(node):
            self.refuse("malformed", 422, "node_id: an ed25519 public key, 64 lowercase hex digits")
        if not isinstance(signature, str) or not SIGNATURE.fullmatch(signature):
            self.refuse("bad_signature", 403, "signature: an ed25519 signature, 128 lowercase hex digits")
        return node

    def gate(self, address: str, body: object) -> None:
        """Before any check: 429 to an address whose refusals spent its bucket, unless `body` names a healthy
        member (verified next: a stranger on the member's host cannot lock it out)."""
        node = body.get("node_id") if isinstance(body, dict) else None
        member = self.pool.is_member(node if isinstance(node, str) else "")
        if not member and self.refusals.tokens(address, time.time()) < 1:
            self.pool.refused["address_limited"] += 1
            raise HTTPException(429, f"more than {self.cfg.address_rate:g} refused requests/s from this address")

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

    def admit(self, token: str, address: str) -> str:
        """The invite `token` belongs to ("" for an open run's token), within its join rate (an invite's own;
        an open run's token and wrong ones: the source address's); else 429 or 403."""
        token = split_token(token)[0]
        if self.pool.token is not None and hmac.compare_digest(token.encode(), self.pool.token.encode()):
            self.limit_joins(f"address {address}", "from this address")
            return ""
        try:
            found = self.pool.invites.find(token)
        except InviteError as e:  # the operator's file is broken: say so, refuse the join, keep the run
            log.error(f"volunteers: {e}")
            raise HTTPException(503, "the run cannot read its invites") from None
        if found is None:
            self.limit_joins(f"address {address}", "from this address")
            self.refuse("bad_token", 403, "wrong join token")
        name, entry = found
        self.limit_joins(f"invite {name}", "with this invite")
        if entry.get("revoked"):
            self.refuse("revoked", 403, f"this invite was revoked: {entry['revoked']}")
        return name

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

    def limit_joins(self, key: str, where: str) -> None:
        """`join_rate` joins per second (a bucket of `join_burst`) per `key`: a join costs a signature check and
        perhaps a member; unknown nodes have no bucket of their own."""
        if not self.joins.take(key, time.time()):
            self.refuse("join_limited", 429, f"more than {self.cfg.join_rate:g} joins/s {where}")

    async def join(self, body: dict, address: str) -> dict:
        pool = self.pool
        invite = self.admit(str(body.get("token", "")) if isinstance(body, dict) else "", address)
        node = self.signer(body)
        if node in pool.ejected:
            self.refuse("ejected", 403, f"this node was ejected from the run: {pool.ejected[node]}")
        if not hello_valid(body, "join"):
            self.refuse("bad_signature", 403, "bad or stale signature")
        member = pool.members.get(node)
        if member is not None and member.invite != invite:
            self.refuse("other_invite", 403, "this node joined with another invite")
        if member is None:
            self.room_for(invite, address)
        self.once(body)  # remembered only for a member, or one about to be
        if member is None:
            pool.members[node] = member = Member(node, time.time(), tokens=self.cfg.burst, refilled=time.time(),
                                                 invite=invite, address=address, record=pool.record(invite))
        if member.status != "healthy" or PREFIX + node not in pool.nodes.nodes:  # new, or back: its record kept
            member.status = "healthy"
            pool.nodes.join(VolunteerNode(node, pool))
            log.info(f"volunteer {pool.who(member)} joined")
        member.last_beat = time.time()
        return JoinAnswer(pool.model, pool.weights, self.cfg.heartbeat_s, self.cfg.dtype).to_json()

    async def submit(self, body: object) -> Response:
        """A lease's submission: from a healthy member, signed, for a lease it holds; then typed and bounded
        by that lease (contract/volunteer.parse_submission) before anything reads it (issue 43): a malformed
        one is a 422 and one strike, and its lease is lost (the task goes to another node)."""
        pool = self.pool
        node = self.signer(body)
        member = pool.members.get(node)
        if member is None or member.status != "healthy":
            self.refuse("ejected" if node in pool.ejected else "unregistered", 403, "not a member of the pool")
        if not submission_signed(body):
            self.refuse("bad_signature", 403, "bad signature")
        self.limit(member)  # its bucket, once the submission is known to be its own
        lease_id = body.get("lease_id")
        p = pool.pending.get(lease_id) if isinstance(lease_id, str) else None
        if p is None or p.node_id != node or p.future.done():
            member.counts["late"] += 1
            raise HTTPException(410, "no such lease in flight for this node (late, or reassigned)")
        try:
            sub = parse_submission(body, p.lease)
        except SchemaError as e:
            p.future.set_exception(LeaseLost(f"node {node[:12]} sent a malformed submission for lease {lease_id[:8]}: {e}"))
            pool.verdict(node, "malformed")
            raise HTTPException(422, f"not a submission for this lease: {e}") from None
        p.future.set_result(sub)
        return Response(status_code=202)

    def submit_limit(self) -> int:
        """The most bytes a submission's body may have: an honest one's for the longest lease seen in flight (a late
        one's is read too, to be answered 410)."""
        self.longest = max([self.longest, *(p.lease.sampling.get("max_tokens", 0) for p in self.pool.pending.values())])
        return submission_max_bytes(self.longest)

    async def read(self, request: Request, limit: int = HELLO_MAX_BYTES) -> object:
        """The request's JSON body, read no further than `limit` bytes and parsed strictly (contract/volunteer.
        loads); else 413 or 400, before anything reads it."""
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > limit:
            self.refuse("too_large", 413, f"a body of {size} bytes, over this route's {limit}")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                self.refuse("too_large", 413, f"a body of over this route's {limit} bytes")
        try:
            return loads(bytes(raw))
        except SchemaError as e:
            self.refuse("malformed", 400, str(e))

    async def checked(self, request: Request, answer, limit: int = HELLO_MAX_BYTES):
        """`answer(body)` for one request on a signed route (its body at most `limit` bytes), behind its address's
        gate; a refusal spends the address's bucket (a member's own 429 and a late submission's 410 do not)."""
        address = request.client.host if request.client else ""
        body = await self.read(request, limit)
        self.gate(address, body)
        try:
            return await answer(body)
        except HTTPException as e:
            if e.status_code in (403, 422):
                self.refusals.take(address, time.time())
            raise

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/pool/join")
        async def join(request: Request) -> dict:
            return await self.join(await self.read(request), request.client.host if request.client else "")

        @app.post("/pool/heartbeat")
        async def heartbeat(request: Request) -> dict:
            return await self.checked(request, self.heartbeat)

        @app.post("/pool/lease")
        async def lease(request: Request) -> Response:
            return await self.checked(request, self.lease)

        @app.post("/pool/submit")
        async def submit(request: Request) -> Response:
            return await self.checked(request, self.submit, self.submit_limit())

        return app

    async def heartbeat(self, body: dict) -> dict:
        member = self.member(body, "heartbeat")
        member.last_beat = time.time()
        return {"status": member.status}

    async def lease(self, body: dict) -> Response:
        member = self.member(body, "lease")
        member.last_beat = time.time()  # asking for work is a sign of life too
        try:
            wait = max(0.0, min(float(body.get("wait_s", 10.0)), 30.0))  # NaN: 0
        except (TypeError, ValueError):
            self.refuse("malformed", 422, "wait_s: seconds to wait for a lease, a number")
        try:
            while True:  # skip leases whose task already went elsewhere
                lease = await asyncio.wait_for(member.queue.get(), wait)
                if lease.lease_id in self.pool.pending:
                    return JSONResponse(asdict(lease))
        except asyncio.TimeoutError:
            return Response(status_code=204)

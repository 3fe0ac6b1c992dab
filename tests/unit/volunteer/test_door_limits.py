"""Replay and admission at the pool's door (issue 43, items 5, 7 and 8), through its real routes in
process (no socket), the door's clock moved by hand:

- a copied lease hello with its signature re-cased (upper case, or spaced: `bytes.fromhex` reads both)
  took the victim's lease: now refused, the signature in one form only and remembered as bytes;
- 30 tokenless joins from one host locked an invited worker on that host out, and the worker exited at
  its first 429: joins now count per invite (per address only for an open run's token and wrong ones),
  and the real `Worker.join` backs off and tries again, for a bounded time, with one line when it stops;
- hellos of keys that never joined were verified and remembered; a request naming a member spent the
  member's bucket before its signature was checked; nothing limited an address on the other routes:
  now nothing is verified or remembered for a non-member, a member's bucket is spent only by its own
  signed requests, and an address's refusals have a bucket of their own (its members still get in).
"""

import asyncio
import base64
import contextlib
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from composer_prime.config.sampling import SamplingParams
from composer_prime.config.volunteers import VolunteersConfig, WorkerConfig
from composer_prime.contract.volunteer import Submission, hello, node_id
from composer_prime.contract.weights import Directory
from composer_prime.orchestrator.pool import NodePool
from composer_prime.volunteer import door, worker
from composer_prime.volunteer.invites import Invites
from composer_prime.volunteer.pool import VolunteerPool
from composer_prime.volunteer.worker import Ejected, Worker

PROOF = base64.b64encode(b"\x00\x07" + bytes(range(256))).decode()  # a well-formed proof: 2 + 2 x 128 bytes


class Clock:
    def __init__(self) -> None:
        self.now = 1e9

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """The door's and the worker's clock (rate buckets, the worker's deadline), moved by hand."""
    c = Clock()
    monkeypatch.setattr(door, "time", c)
    monkeypatch.setattr(worker, "time", c)
    return c


def make_pool(tmp_path: Path, open_run: bool = False, **cfg) -> VolunteerPool:
    v = VolunteersConfig(enabled=True, open=open_run, join_token="t" if open_run else None, **cfg)
    return VolunteerPool(v, NodePool([]), "t" if open_run else None, Directory("/run/weights"), "tiny",
                         Invites(tmp_path / "invites.json"))


def routes(p: VolunteerPool) -> httpx.AsyncClient:
    """The pool's routes in this event loop, every request from one address (127.0.0.1)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=p.door.app()), base_url="http://pool")


async def joined(http: httpx.AsyncClient, token: str):
    key = Ed25519PrivateKey.generate()
    assert (await http.post("/pool/join", json=hello(key, "join", token=token))).status_code == 200
    return key


def test_a_lease_hello_copied_with_its_signature_re_cased_takes_no_lease(tmp_path):
    async def go():
        p = make_pool(tmp_path, open_run=True)
        async with routes(p) as http:
            victim = await joined(http, "t")
            asked = hello(victim, "lease", wait_s=0.05)
            first = (await http.post("/pool/lease", json=asked)).status_code  # nothing leased yet: 204
            leasing = asyncio.create_task(p.lease(node_id(victim), [1, 2], SamplingParams(seed=1), 0))
            await asyncio.sleep(0)
            sig = asked["signature"]
            copies = [sig.upper(), " ".join(sig[i:i + 2] for i in range(0, len(sig), 2))]
            answers = [(await http.post("/pool/lease", json={**asked, "signature": c})).status_code for c in copies]
            left = p.members[node_id(victim)].queue.qsize()
            leasing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await leasing
            return first, answers, left
    assert asyncio.run(go()) == (204, [403, 403], 1)  # before: 200, the victim's lease taken


def test_strangers_tokenless_joins_do_not_lock_out_an_invited_worker_on_their_host(tmp_path, clock):
    async def go():
        p = make_pool(tmp_path)
        token = p.invites.invite("alice")
        async with routes(p) as http:
            strangers = [(await http.post("/pool/join", json=hello(Ed25519PrivateKey.generate(), "join"))).status_code
                         for _ in range(30)]
            w = InProcess(p, http, token, tmp_path)
            await w.join()
            return strangers, p.is_member(w.node), w.pauses
    strangers, member, pauses = asyncio.run(go())
    assert strangers == [403] * 20 + [429] * 10  # the address's bucket (`join_burst` 20), spent by wrong tokens
    assert member and pauses == []  # before: 429 at its first join, and the worker exited


class InProcess(Worker):
    """The real worker's `join`, its requests sent to the pool's routes in process, its pauses moving the clock."""

    def __init__(self, p: VolunteerPool, http: httpx.AsyncClient, token: str, tmp: Path) -> None:
        super().__init__(WorkerConfig(join="http://127.0.0.1:8600", token=token, key_path=tmp / "w.key", work_dir=tmp),
                         Ed25519PrivateKey.generate())
        self.http, self.pauses = http, []

    async def post(self, route: str, body: dict):
        r = await self.http.post(f"/pool/{route}", json=body)
        return r.status_code, r.json() if r.status_code == 200 else {"detail": r.text}

    async def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        door.time.now += seconds


@pytest.mark.parametrize("wait_s", [120.0, 5.0])
def test_a_worker_limited_at_its_join_tries_again_until_its_deadline(tmp_path, clock, wait_s, caplog):
    """The invite's bucket (2, refilled at 0.25/s) spent by its two other keys: the worker's join is 429,
    then again after 1 and 2 s (0.25, 0.75 tokens), then joins after 4 more (1.75); with 5 s to wait it
    stops after the second pause (3 + 4 > 5 s) with one line. Before: it stopped at the first 429."""
    async def go():
        p = make_pool(tmp_path, join_rate=0.25, join_burst=2)
        token = p.invites.invite("bob")
        async with routes(p) as http:
            for _ in range(2):
                await joined(http, token)
            w = InProcess(p, http, token, tmp_path)
            try:
                await w.join(wait_s=wait_s)
                return "joined", w.pauses, p.is_member(w.node)
            except Ejected as e:
                return str(e), w.pauses, p.is_member(w.node)
    said, pauses, member = asyncio.run(go())
    if wait_s == 120.0:
        assert (said, pauses, member) == ("joined", [1.0, 2.0, 4.0], True)
    else:
        assert said == "the pool at http://127.0.0.1:8600 still limits joins after 5 s: " \
                       '{"detail":"more than 0.25 joins/s with this invite"}' and pauses == [1.0, 2.0] and not member
    assert sum("limits joins" in r.message for r in caplog.records) == 1  # one line, not one a try


def test_a_non_members_hellos_are_neither_verified_nor_remembered(tmp_path, clock, monkeypatch):
    verified = []
    real = door.hello_valid
    monkeypatch.setattr(door, "hello_valid", lambda body, route: verified.append(route) or real(body, route))

    async def go():
        p = make_pool(tmp_path, open_run=True)  # 200 refusals an address before its 429s
        async with routes(p) as http:
            member = await joined(http, "t")  # its join: verified, remembered
            for route in ("heartbeat", "lease") * 25:
                assert (await http.post(f"/pool/{route}", json=hello(Ed25519PrivateKey.generate(), route,
                                                                     **({"wait_s": 0.0} if route == "lease" else {})))
                        ).status_code == 403
            beat = (await http.post("/pool/heartbeat", json=hello(member, "heartbeat"))).status_code
        return p, beat
    p, beat = asyncio.run(go())
    assert beat == 200 and verified == ["join", "heartbeat"] and p.refused["unregistered"] == 50
    assert len(p.door.replays._seen) == 1  # the member's key only; before: 51 keys, each hello verified


def test_a_request_naming_a_member_spends_its_bucket_only_once_its_signature_verifies(tmp_path, clock):
    async def go():
        p = make_pool(tmp_path, open_run=True, rate=1e-6, burst=3)
        async with routes(p) as http:
            member = await joined(http, "t")
            node, other = node_id(member), Ed25519PrivateKey.generate()
            forged = [{**hello(other, "heartbeat"), "node_id": node} for _ in range(5)]
            beats = [(await http.post("/pool/heartbeat", json=f)).status_code for f in forged]
            sub = Submission(node, "lease", 0, "0" * 64, [5], [-0.5], 0, [PROOF]).signed(other)
            submitted = (await http.post("/pool/submit", json=asdict(sub))).status_code
            own = [(await http.post("/pool/heartbeat", json=hello(member, "heartbeat"))).status_code for _ in range(4)]
        return beats, submitted, own, p.members[node].counts["limited"]
    beats, submitted, own, limited = asyncio.run(go())
    # before: the forged requests spent its 3 tokens (429 from the fourth on) and its own beats were 429
    assert beats == [403] * 5 and 400 <= submitted < 500 and submitted != 429
    assert (own, limited) == ([200, 200, 200, 429], 1)


def test_an_address_refused_too_often_is_answered_429_before_any_check_but_its_members_get_in(tmp_path, clock):
    async def go():
        p = make_pool(tmp_path, open_run=True, address_rate=0.5, address_burst=4)
        async with routes(p) as http:
            member = await joined(http, "t")
            strangers = [(await http.post("/pool/heartbeat", json=hello(Ed25519PrivateKey.generate(), "heartbeat"))
                          ).status_code for _ in range(6)]
            forged = {**hello(Ed25519PrivateKey.generate(), "heartbeat"), "node_id": node_id(member)}
            naming_member = (await http.post("/pool/heartbeat", json=forged)).status_code  # checked: 403, not 429
            own = (await http.post("/pool/heartbeat", json=hello(member, "heartbeat"))).status_code
            clock.now += 2.0  # one refusal's worth refilled
            later = [(await http.post("/pool/lease", json=hello(Ed25519PrivateKey.generate(), "lease", wait_s=0.0))
                      ).status_code for _ in range(2)]
        return strangers, naming_member, own, later, p.refused["address_limited"]
    # before: no bucket per address: every stranger's request 403, each one checked
    assert asyncio.run(go()) == ([403] * 4 + [429] * 2, 403, 200, [403, 429], 3)

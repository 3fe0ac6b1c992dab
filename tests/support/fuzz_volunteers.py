"""The volunteer surface's fuzz test's harness (tests/integration/test_volunteer_surface.py): the
real pool, door and validator (tests/support/volunteers.pool_run) in an event loop on a thread of
its own, against a real trusted server, with a real honest worker and a fuzzing member (a key
joined over HTTP), so hypothesis can drive its examples from the test's thread; and the
strategies for what that member, or anyone, sends: a submission for a lease the member holds, or a
hello or join, each with some fields replaced by random JSON (types, sizes, boundary values) or
dropped, an extra field, re-signed or not, sent as JSON or as broken bytes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
from dataclasses import asdict

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import strategies as st

from composer_prime.contract.volunteer import Submission, hello, node_id, prompt_hash
from composer_prime.contract.weights import Directory
from composer_prime.volunteer.worker import Worker
from tests.support import volunteers as V

FIELDS = sorted(Submission.__dataclass_fields__)
GOOD = base64.b64encode(b"\1\1" + b"\0\1" * 128).decode()  # 2 + 2 x top-k 128 bytes, modulus 257: readable, wrong
EDGES = [-1, 0, 1, 127, 128, 255, 256, 257, 258, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 10**30]
JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.sampled_from(EDGES)
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
                    max_leaves=10)
PROOF_BYTES = (st.binary(max_size=300) | st.binary(min_size=256, max_size=260)
               | st.binary(min_size=256, max_size=256).map(lambda b: b"\0\0" + b)  # a zero modulus
               | st.sampled_from([b"", b"\0\1", b"\1\1" + b"\0\1" * 127, b"\1\1" + b"\0\1" * 129, bytes(258)]))
PROOF = (PROOF_BYTES.map(lambda b: base64.b64encode(b).decode()) | st.text(max_size=350)
         | st.just(GOOD[:-2] + "B=") | st.just(GOOD + "\n") | JSON)
VALUES = {  # what a submission's field may be replaced with, beside any JSON
    "token_ids": st.lists(st.integers(-2, 300) | st.sampled_from(EDGES), max_size=12),
    "logprobs": st.lists(st.floats(max_value=1.0, allow_nan=False) | st.sampled_from([0, -0.0, -1e-300, 1e308]), max_size=12),
    "proofs": st.lists(PROOF, max_size=3),
    "sampler": st.sampled_from(["seeded", "any", "", "SEEDED", "nucleus"]),
    "prompt_sha256": st.text("0123456789abcdefABCDEF ", min_size=63, max_size=65),
}
BROKEN = ["nan", "truncated", "not utf-8", "deep", "padded"]


def one_in(n: int, value: bool = True):
    """`value` one time in `n` (hypothesis draws small integers far more often than 1 in n)."""
    return st.sampled_from([not value] * (n - 1) + [value])


def canonical(fields: dict) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def signed_by(body: object, key: Ed25519PrivateKey, lease_id: str) -> bool:
    """Whether `body` is a submission for `lease_id` in `key`'s name with its valid signature (over the fields
    a submission has): what the pool can charge to that key."""
    if not isinstance(body, dict) or body.get("node_id") != node_id(key) or body.get("lease_id") != lease_id:
        return False
    try:
        key.public_key().verify(bytes.fromhex(body["signature"]), canonical(
            {k: body[k] for k in FIELDS if k in body and k != "signature"}))
        return True
    except (KeyError, TypeError, ValueError, InvalidSignature):
        return False


def encode(draw, body: object) -> bytes:
    """`body` as JSON, or (one in five) as one of the ways a body breaks."""
    how, raw = draw(st.sampled_from(BROKEN)) if draw(one_in(5)) else "json", json.dumps(body).encode()
    if how == "nan":
        return raw[:-1] + b', "x": NaN}' if raw.endswith(b"}") else b"NaN"
    if how == "truncated":
        return raw[:draw(st.integers(0, max(0, len(raw) - 1)))]
    return {"json": raw, "not utf-8": b"\xff\xfe" + raw, "deep": b"[" * 3_000, "padded": raw + b" " * 100_000}[how]


def sign(key: Ed25519PrivateKey, body: dict) -> None:
    body["signature"] = key.sign(canonical({k: v for k, v in body.items() if k in FIELDS and k != "signature"})).hex()


@st.composite
def plausible(draw, body: dict, stop: int) -> None:
    """`body` made one the door lets through, wrong all the same: token ids (some beyond the vocabulary)
    ending in the stop token, log-probs, one proof of random coefficients and modulus (top-k 128 mostly;
    the trusted server refuses another), perhaps another seed, version or prompt hash."""
    ids = draw(st.lists(st.integers(0, 300).filter(lambda t: t != stop) | st.sampled_from([2**31 - 1]), max_size=7))
    body["token_ids"] = ids + [stop]
    body["logprobs"] = draw(st.lists(st.floats(-60.0, 0.0), min_size=len(ids) + 1, max_size=len(ids) + 1))
    k = draw(st.sampled_from([128, 128, 128, 1, 127]))
    modulus = draw(st.integers(1, 65535)).to_bytes(2, "big")
    body["proofs"] = [base64.b64encode(modulus + draw(st.binary(min_size=2 * k, max_size=2 * k))).decode()]
    for name, value in (("seed", st.integers(-(2**63), 2**63 - 1)), ("weight_version", st.integers(0, 2**63 - 1)),
                        ("prompt_sha256", st.text("0123456789abcdef", min_size=64, max_size=64))):
        if draw(one_in(6)):
            body[name] = draw(value)


@st.composite
def submission(draw, key: Ed25519PrivateKey, lease: dict, door_valid: bool) -> tuple[bytes, bool]:
    """A submission for `lease` (one token, the stop token; a readable, wrong proof) made `plausible` (with
    `door_valid`), or with some fields replaced or dropped and perhaps a field more; re-signed by `key` or
    not: (its bytes, whether the pool can charge `key`)."""
    stop = lease["sampling"]["stop_token_ids"][0]
    body = {k: v for k, v in asdict(Submission(node_id(key), lease["lease_id"], lease["weight_version"],
                                               prompt_hash(lease["prompt_ids"]), [stop], [-1.0],
                                               lease["sampling"]["seed"], [GOOD])).items() if k != "signature"}
    sign(key, body)
    if door_valid:
        draw(plausible(body, stop))
    else:
        for name in draw(st.sets(st.sampled_from(FIELDS), min_size=1, max_size=3)):
            if draw(one_in(6)):
                del body[name]
            else:
                body[name] = draw(VALUES[name] | JSON if name in VALUES else JSON)
        if draw(one_in(5)):
            body[draw(st.text(min_size=1, max_size=8))] = draw(JSON)
    if draw(one_in(5, False)) and not {"node_id", "signature"} - set(body):
        sign(key, body)
    raw = encode(draw, body)
    try:
        strict = json.dumps(body, allow_nan=False).encode()
    except ValueError:  # an Infinity among the values: no JSON, which the pool cannot read, let alone charge
        strict = None
    return raw, raw == strict and signed_by(body, key, lease["lease_id"])


@st.composite
def greeting(draw, key: Ed25519PrivateKey) -> tuple[str, bytes]:
    """A join, heartbeat or lease hello by `key` or a stranger, some field changed, dropped or added after it
    was signed: (its route, its bytes). None is good."""
    route = draw(st.sampled_from(["join", "heartbeat", "lease"]))
    who = key if draw(st.booleans()) else Ed25519PrivateKey.generate()
    body = hello(who, route, **{"join": {"token": V.TOKEN}, "lease": {"wait_s": 0.0}}.get(route, {}))
    for name in draw(st.sets(st.sampled_from(sorted(body)), min_size=1, max_size=2)):
        if draw(one_in(5)):
            del body[name]
        else:
            old, new = json.dumps(body[name]), draw(JSON)
            body[name] = new if json.dumps(new) != old else [new]
    if draw(one_in(5)):
        body[draw(st.text(min_size=1, max_size=8))] = draw(JSON)
    return route, encode(draw, body)


class Background:
    """`pool_run` and an honest worker, in an event loop on a thread of its own, until `close`."""

    def __init__(self, trusted: tuple[str, object], run_dir, honest_dir, **volunteers) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stack = contextlib.AsyncExitStack()

        async def enter():
            client, pool = await self.stack.enter_async_context(V.pool_run(trusted[0], "tiny", run_dir, **volunteers))
            pool.weights = Directory(str(trusted[1]))
            honest = await self.stack.enter_async_context(V.working(V.make_worker(Worker, pool, honest_dir, "honest")))
            return client, pool, honest
        self.client, self.pool, self.honest = self.call(enter())

    def call(self, coro, timeout: float = 120.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        """The pool stopped, every task of the loop ended, the loop closed."""
        async def shutdown():
            with contextlib.suppress(Exception):
                await self.stack.aclose()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.call(shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()

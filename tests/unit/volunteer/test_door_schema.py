"""The submission route's schema (volunteer/door.py, contract/volunteer.parse_submission), over
the door's real ASGI app in memory, the pool in memory, a member holding a lease: what issue 43's
red team sent is refused at the door, before any audit, each one 4xx and one strike, and the lease
lost (its task goes to another node):

- crafted proofs that killed the trusted server's TOPLOC verifier (item 1: a zero modulus, SIGFPE;
  a 2-byte proof, SIGSEGV), and every proof not exactly 2 + 2 x top-k bytes of canonical base64;
- wrong JSON types (item 2: `logprobs: [null]`, `proofs: [12345]` crashed the orchestrator);
- a proof of megabytes (item 3: 42.7 MB cost 13 s of trusted audit): its body is over what an
  honest submission for the lease can be, 413 before it is parsed; a proof a few bytes long, 422.
"""

import asyncio
import base64
import json
import time
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from composer_prime.config.sampling import SamplingParams
from composer_prime.config.volunteers import VolunteersConfig
from composer_prime.contract.volunteer import Submission, node_id
from composer_prime.contract.weights import Directory
from composer_prime.orchestrator.pool import NodePool
from composer_prime.volunteer.invites import Invites
from composer_prime.volunteer.members import LeaseLost, Member
from composer_prime.volunteer.pool import VolunteerPool

KEY = Ed25519PrivateKey.generate()
NODE = node_id(KEY)
PROOF = base64.b64encode(bytes(i % 255 + 1 for i in range(258))).decode()  # 2 + 2 x top-k 128 bytes
b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
CRAFTED = {  # the proof (of one token's submission) and what the door says of it
    "zero modulus (SIGFPE)": (b64(b"\0\0" + b"\0\1" * 128), "modulus 0"),
    "2 bytes (SIGSEGV)": (b64(b"\0\1"), "a proof of 2 bytes"),
    "an odd length": (b64(b"\1\1" + b"\0\1" * 127 + b"\7"), "a proof of 257 bytes"),
    "over 128 coefficients": (b64(b"\1\1" + b"\0\1" * 129), "at most 344 characters"),
    "not canonical base64": (PROOF[:-2] + "B=", "not canonical base64"),
    "null": (b64(bytes(258)), "a null proof"),
    "a number (item 2)": (12345, "a base64 string"),
}
TYPES = {"logprobs": [None], "token_ids": ["5"], "seed": "3", "weight_version": None, "sampler": 1, "lease_id": 7}


def body(lease_id: str, /, **over) -> dict:
    """A submission of one token for `lease_id`, with `over` replaced, signed over what it then holds."""
    fields = {k: v for k, v in asdict(Submission(NODE, lease_id, 4, "0" * 64, [5], [-0.5], 3, [PROOF])).items()
              if k != "signature"} | over
    return fields | {"signature": KEY.sign(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hex()}


def door_answer(make_body) -> tuple[int, str, dict, int, str]:
    """Post `make_body(lease_id)` for a lease held by NODE: (status, detail, its counts, audits asked for, what the
    lease ended in)."""
    async def go():
        p = VolunteerPool(VolunteersConfig(enabled=True, open=True), NodePool([]), "t", Directory("/run/weights"), "tiny",
                          Invites(Path("/nonexistent/invites.json")))
        p.members[NODE] = Member(NODE, time.time(), tokens=p.cfg.burst, refilled=time.time())
        audits = []
        p.validator = type("Spy", (), {"check": lambda self, lease, sub: audits.append(sub)})()
        task = asyncio.create_task(p.lease(NODE, [1, 2], SamplingParams(max_tokens=4, seed=3), 4))
        lease = await p.members[NODE].queue.get()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=p.door.app()), base_url="http://pool") as http:
            r = await http.post("/pool/submit", json=make_body(lease.lease_id))
        if not p.pending[lease.lease_id].future.done():
            task.cancel()
            ended = "pending"  # until its deadline
        else:
            try:
                ended = f"submitted {(await task)[1].lease_id == lease.lease_id}"
            except LeaseLost as e:
                ended = f"lost: {e}"
        return r.status_code, r.json()["detail"] if r.status_code != 202 else "", dict(p.members[NODE].counts), len(audits), ended
    return asyncio.run(go())


def test_an_honest_submission_passes_the_door():
    assert door_answer(body) == (202, "", {"leased": 1}, 0, "submitted True")


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_proof_the_native_verifier_cannot_read_is_one_4xx_and_one_strike_before_any_audit(case):
    proof, why = CRAFTED[case]
    status, detail, counts, audits, ended = door_answer(lambda lease_id: body(lease_id, proofs=[proof]))
    assert (status, counts, audits) == (422, {"leased": 1, "rejected:malformed": 1}, 0)
    assert why in detail and ended.startswith("lost:") and why in ended


@pytest.mark.parametrize("field", list(TYPES))
def test_a_signed_submission_of_the_wrong_json_types_is_one_4xx_and_one_strike(field):
    status, detail, counts, audits, ended = door_answer(lambda lease_id: body(lease_id, **{field: TYPES[field]}))
    expected = (410, {"leased": 1, "late": 1}) if field == "lease_id" else (422, {"leased": 1, "rejected:malformed": 1})
    assert (status, counts, audits) == (*expected, 0)  # a lease id that is no string names no lease of its


def test_more_tokens_or_proofs_than_the_lease_allows_are_refused():
    five = door_answer(lambda lease_id: body(lease_id, token_ids=[5] * 5, logprobs=[-0.5] * 5))  # max_tokens: 4
    two = door_answer(lambda lease_id: body(lease_id, proofs=[PROOF, PROOF]))
    for status, detail, counts, audits, _ in (five, two):
        assert (status, counts, audits) == (422, {"leased": 1, "rejected:malformed": 1}, 0)
    assert "5 tokens (from 1 to the lease's max_tokens, 4)" in five[1] and "2 proofs for 1 tokens" in two[1]


def test_a_proof_of_megabytes_is_413_before_it_is_parsed():
    huge = b64(b"\1\1" + b"\0\1" * 1_290_000)  # 2.58 MB: 10,000 honest proofs' worth
    status, detail, counts, audits, ended = door_answer(lambda lease_id: body(lease_id, proofs=[huge]))
    assert status == 413 and "over this route's" in detail and audits == 0
    assert counts == {"leased": 1} and ended == "pending"  # unread, so no one's to charge; the lease ends at its deadline

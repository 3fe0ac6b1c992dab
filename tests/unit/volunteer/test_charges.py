"""Charges that add up per volunteer (issue 43, items 4 and 6), through the real path: the client's
`VolunteerNode.complete` (probation, leases, the validator's verdicts), the pool's bookkeeping, and a
worker that takes its leases and submits through the pool's own routes (in process, no socket). The
validator's verdict is answered in memory (the checks themselves: test_validator_samplers.py and the
red team's integration tests): a submission claiming the log-probs the trusted prefill measures
passes, any other is rejected at `logprobs`.

- A veto worker submits junk on one lease of each group and honest work on the other seven: the group
  is dropped for one strike, which the seven accepted leases took back to 0; now a group's worth of
  accepted work takes half a strike off, never the half of a rejection that is kept: ejected at its
  third veto, in a row or every other group.
- A partial-hoard worker sits on one lease of a group and answers the other seven: the whole request
  waits out the deadline and is sent again, for a quarter strike the next honest group wiped; now the
  lease costs its request, 8 x 0.25: ejected at once.
- Eight keys of one invite, each rejected once, were eight records of one strike and no ejection; now
  one volunteer's: ejected at the second rejection, every key with it, the invite revoked.
"""

import asyncio
import base64
import contextlib
import time
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from composer_prime.config.sampling import SamplingParams
from composer_prime.config.volunteers import VolunteersConfig
from composer_prime.contract.volunteer import Lease, Submission, hello, node_id
from composer_prime.contract.weights import Directory
from composer_prime.orchestrator.pool import NodePool
from composer_prime.volunteer.invites import Invites
from composer_prime.volunteer.members import LeaseLost
from composer_prime.volunteer.node import VolunteerNode
from composer_prime.volunteer.pool import VolunteerPool

TRUE_LP, TOKENS = -0.5, 4  # what the trusted prefill measures for every token; a completion fills its budget
PROOF = base64.b64encode(b"\x00\x07" + bytes(range(256))).decode()  # 2 + 2 x 128 bytes, a nonzero modulus


class Judge:
    """The validator's verdict, in memory."""

    async def check(self, lease: Lease, sub: Submission) -> str:
        return "" if sub.logprobs == [TRUE_LP] * len(sub.token_ids) else "logprobs"


def make_pool(tmp_path: Path, **cfg) -> VolunteerPool:
    v = VolunteersConfig(enabled=True, open=True, join_token="t", **cfg)
    p = VolunteerPool(v, NodePool([]), "t", Directory("/run/weights"), "tiny", Invites(tmp_path / "invites.json"))
    p.validator = Judge()
    return p


async def worker(http: httpx.AsyncClient, key, answer) -> None:
    """Takes leases and answers each as `answer(first)` says ("honest", "junk", "withhold"; `first`: the
    first lease of its group it saw) until the pool refuses it."""
    seen = set()
    while True:
        r = await http.post("/pool/lease", json=hello(key, "lease", wait_s=0.05))
        if r.status_code == 403:
            return
        if r.status_code != 200:
            continue
        lease = Lease(**r.json())
        what = answer(lease.prompt_sha256 not in seen)
        seen.add(lease.prompt_sha256)
        if what == "withhold":
            continue
        lps = [TRUE_LP if what == "honest" else -0.05] * TOKENS
        sub = Submission(node_id(key), lease.lease_id, lease.weight_version, lease.prompt_sha256, [5] * TOKENS, lps,
                         lease.sampling["seed"], [PROOF]).signed(key)
        await http.post("/pool/submit", json=asdict(sub))


def groups(tmp_path: Path, answers, n: int, **cfg) -> tuple[list, VolunteerPool, str]:
    """`n` groups of 8 asked of one worker in turn through `VolunteerNode.complete` (the worker answering each
    lease as `answers(group)(first)` says); each group's outcome (its verdicts, or the LeaseLost) and the
    strikes after it."""
    async def go():
        p, key, group = make_pool(tmp_path, **cfg), Ed25519PrivateKey.generate(), [0]
        transport = httpx.ASGITransport(app=p.door.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://pool") as http:
            assert (await http.post("/pool/join", json=hello(key, "join", token="t"))).status_code == 200
            node = node_id(key)
            task = asyncio.create_task(worker(http, key, lambda first: answers(group[0])(first)))
            out = []
            for group[0] in range(n):
                if not p.is_member(node):
                    break
                try:
                    done = await VolunteerNode(node, p).complete([1, 2, group[0]], SamplingParams(max_tokens=TOKENS,
                                                                                                seed=0), 8)
                    out.append((sorted(c.verdict for c in done), p.members[node].strikes))
                except LeaseLost as e:
                    out.append((str(e).split("'s ")[-1], p.members[node].strikes))
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return out, p, node
    return asyncio.run(go())


def veto(first: bool) -> str:
    return "junk" if first else "honest"


def honest(first: bool) -> str:
    return "honest"


VETOED = [""] * 7 + ["logprobs"]


def test_a_veto_worker_is_ejected_at_its_third_veto_in_a_row(tmp_path):
    """Junk on one lease of each group: 1 strike (0.5 kept), the seven accepted 7/16 off: 0.5625, 1.125,
    then 2.125 and ejected. Before: 1 - 7 x 0.5 -> 0 after every group, for ever."""
    out, p, node = groups(tmp_path, lambda g: veto, 5)
    assert out == [(VETOED, 0.5625), (VETOED, 1.125), (VETOED, 2.125)]
    assert node in p.ejected and p.members[node].counts["rejected:logprobs"] == 3


def test_a_veto_every_other_group_is_ejected_at_its_third(tmp_path):
    """Vetoes between honest groups: each honest group's half strike stops at what the vetoes kept (0.5,
    then 1.0), so the third veto makes 2.0. Before: back to 0 after each group."""
    out, p, node = groups(tmp_path, lambda g: honest if g % 2 else veto, 8)
    assert out == [(VETOED, 0.5625), ([""] * 8, 0.5), (VETOED, 1.5 - 7 / 16), ([""] * 8, 1.0), (VETOED, 2.0)]
    assert node in p.ejected


def test_a_worker_sitting_on_one_lease_of_a_group_is_charged_the_group_and_ejected(tmp_path):
    """One lease of eight withheld every other group, seven answered: the client sends the whole request
    again after the deadline, so the lease costs 8 x 0.25 = 2 strikes: ejected at the first. Before: 0.25,
    which the next honest group took off, for ever."""
    hoard = lambda first: "withhold" if first else "honest"  # noqa: E731
    out, p, node = groups(tmp_path, lambda g: honest if g % 2 else hoard, 4, lease_s=0.2)
    assert out == [("deadline", 2.0)]
    assert node in p.ejected and p.members[node].counts["missed"] == 1


def test_an_honest_worker_loses_nothing(tmp_path):
    out, p, node = groups(tmp_path, lambda g: honest, 3)
    assert out == [([""] * 8, 0.0)] * 3 and p.is_member(node) and p.members[node].counts["accepted"] == 24


def test_strikes_add_up_over_the_keys_of_one_invite(tmp_path):
    """Eight keys joined with one invite, each rejected once: one volunteer's second strike ejects them all
    and revokes the invite. Before: a record per key, 1 strike each, all eight members."""
    p = make_pool(tmp_path)
    http, token = TestClient(p.door.app()), p.invites.invite("mallory")
    keys = [Ed25519PrivateKey.generate() for _ in range(8)]
    assert {http.post("/pool/join", json=hello(k, "join", token=token)).status_code for k in keys} == {200}
    nodes = [node_id(k) for k in keys]
    p.verdict(nodes[0], "toploc")
    assert all(p.is_member(n) and p.members[n].strikes == 1.0 for n in nodes)  # one record, seen by every key
    p.verdict(nodes[1], "toploc")
    assert set(p.ejected) == set(nodes) and p.invites.table()["mallory"]["revoked"].startswith(
        f"node {nodes[1][:12]} ejected: 2 strikes")
    again = http.post("/pool/join", json=hello(Ed25519PrivateKey.generate(), "join", token=token))
    assert again.status_code == 403 and "revoked" in again.json()["detail"]

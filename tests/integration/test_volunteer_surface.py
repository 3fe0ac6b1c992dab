"""The volunteer pool's untrusted surface against the real door, pool, validator and trusted server
(issue 43): what a member sends is typed and bounded before anything reads it.

- Crafted proofs (item 1) posted straight to the trusted server's audit route are 422s and it
  answers after: TOPLOC's native verifier, which they killed (a zero modulus: SIGFPE; a 2-byte
  proof: SIGSEGV), is handed only proofs it can read (verify/toploc.measure). Through the door the
  issue's own reproduction is one 422 and one strike.
- A signed submission of the wrong JSON types (item 2) on the orchestrator's real path (the
  client's request, the node, the door) is one strike, and the client's request is answered by the
  next node; it raised TypeError out of the client's request, which stopped the orchestrator.
- A proof of megabytes (item 3: 42.7 MB cost 13 s of trusted audit) is refused by the door before
  it is read, and by the trusted server's request schema.
- Truncated, missing or null proofs and a reported reward: one strike each at the door, the lease
  lost; a forged signature or an unregistered key: refused, and nobody charged.
- The fuzz test: generated submissions, hellos and joins (random JSON types, sizes, encodings and
  boundary values; hypothesis, derandomized and bounded in count) with honest requests between
  them (tests/support/fuzz_volunteers.py).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from collections import Counter
from dataclasses import asdict

import aiohttp
import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.volunteer import Submission, hello, node_id
from composer_prime.volunteer.members import PREFIX, LeaseLost
from composer_prime.volunteer.node import VolunteerNode
from composer_prime.volunteer.worker import Worker
from tests.support import fuzz_volunteers as F
from tests.support import volunteers as V
from tests.support.trusted_server import PROMPT, ask, run, trusted  # noqa: F401 - trusted: a fixture

EOS = 5  # the leases' stop token here
SUBMISSIONS, PLAUSIBLE, GREETINGS = 30, 15, 15  # hypothesis examples, derandomized (the same ones every run)
JSON_BODY = {"content-type": "application/json"}
b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
GOOD = b64(b"\1\1" + b"\0\1" * 128)  # 2 + 2 x top-k 128 bytes, modulus 257: readable, and wrong
CRAFTED = {"zero modulus": [b64(b"\0\0" + b"\0\1" * 128)], "2 bytes": [b64(b"\0\1")],  # SIGFPE, SIGSEGV
           "top-k 127 on a model of width 128": [b64(b"\1\1" + b"\0\1" * 127)],
           "a proof past the last chunk": [GOOD] * 3}  # its thread's exception aborted the process


def audit_body(proofs: list, **over) -> dict:
    """An audit request for the issue's reproduction: one token, the stop token, claimed at -1.0."""
    return {"weight_version": 1, "token_ids": PROMPT + [EOS], "prompt_len": len(PROMPT), "proofs": proofs,
            "logprobs": [-1.0], "seed": 0, "sampling_params": {"max_tokens": 8, "stop_token_ids": [EOS], "seed": 0},
            "dtype": "float32", **over}


def test_crafted_proofs_straight_to_the_trusted_server_are_422s_and_it_answers_after(trusted):
    url, _ = trusted
    for name, proofs in CRAFTED.items():
        r = httpx.post(f"{url}/inference/v1/audit", json=audit_body(proofs), timeout=60)
        assert r.status_code == 422 and "proofs not measurable" in r.text, (name, r.status_code, r.text)
        assert httpx.get(f"{url}/health").status_code == 200, name


class Sends(Worker):
    """Generates nothing: answers each lease with `fields` over the issue's reproduction (one token, the stop
    token, claimed at -1.0, one proof), signed as sent: what a red team's script sends."""

    fields: dict = {}

    async def work(self, lease):
        sub = Submission(self.node, lease.lease_id, lease.weight_version, lease.prompt_sha256, [EOS], [-1.0],
                         lease.sampling["seed"], CRAFTED["zero modulus"])
        return dataclasses.replace(sub, **self.fields).signed(self.key)


def picked(client, worker) -> None:
    """The client's next request goes to `worker`."""
    while client.pool.pick().name != PREFIX + worker.node:
        pass
    client.pool._turn -= 1


def test_a_crafted_or_mistyped_submission_on_the_orchestrators_path_is_one_strike_and_the_task_goes_on(trusted, tmp_path):
    """Items 1 and 2 as the orchestrator meets them: its client's request, given to the member, is answered
    by the trusted server instead; the member is charged once each time; the trusted server still answers."""
    async def body(client, pool):
        w = V.make_worker(Sends, pool, tmp_path, "sends")
        out = []
        async with V.working(w):
            for fields in ({}, {"logprobs": [None]}, {"proofs": [12345]}):  # the proof; the two wrong types
                w.fields = fields
                picked(client, w)
                c = await client.generate(PROMPT, SamplingParams(max_tokens=8, seed=5, stop_token_ids=(EOS,)))
                out.append((c.node.startswith("http://"), c.verdict, pool.members[w.node].counts["rejected:malformed"]))
            return out, pool.members[w.node].counts.get("accepted", 0)
    out, accepted = run(trusted, tmp_path, body, eject_after=10)
    assert out == [(True, "", 1), (True, "", 2), (True, "", 3)] and accepted == 0  # answered by the trusted server
    assert httpx.get(f"{trusted[0]}/health").status_code == 200


def test_a_proof_of_megabytes_is_refused_unread_by_the_door_and_by_the_trusted_servers_schema(trusted, tmp_path):
    """42.7 MB, the issue's: 413 at the door, from its length alone; 1 MB straight to the trusted server's
    audit route: 422 from its request schema (each proof at most 344 characters), where it was measured."""
    huge = b64(b"\1\1" + b"\0\1" * 21_350_000)

    async def body(client, pool):
        w = V.make_worker(Sends, pool, tmp_path, "huge")
        w.fields = {"proofs": [huge]}
        statuses = []

        async def submit(lease, sub):  # the worker's own, which says nothing of the answer
            async with w._http.post(f"{w.url}/pool/submit", json=dataclasses.asdict(sub)) as r:
                statuses.append((r.status, await r.text()))
        w.submit = submit
        async with V.working(w):
            task = asyncio.create_task(pool.lease(w.node, PROMPT, SamplingParams(max_tokens=8, seed=1), 1))
            while not statuses:
                await asyncio.sleep(0.05)
            task.cancel()
        return statuses, dict(pool.refused), dict(pool.members[w.node].counts)
    statuses, refused, counts = run(trusted, tmp_path, body)
    assert statuses[0][0] == 413 and "over this route's" in statuses[0][1] and refused.get("too_large") == 1
    assert not any(k.startswith("rejected:") for k in counts)  # unread: nobody to charge
    r = httpx.post(f"{trusted[0]}/inference/v1/audit", json=audit_body([b64(b"\1\1" + b"\0\1" * 500_000)]), timeout=60)
    assert r.status_code == 422 and "344" in r.text


PROOF_EDITS = {
    "truncated": lambda proofs: proofs[:-1],
    "missing": lambda proofs: [],
    "null": lambda proofs: [base64.b64encode(bytes(258)).decode()] * len(proofs),
}


@pytest.mark.parametrize("edit", list(PROOF_EDITS))
def test_truncated_missing_or_null_proofs_are_malformed(trusted, tmp_path, edit):
    async def body(client, pool):
        w = V.make_worker(V.Proofs, pool, tmp_path, edit)
        w.edit = PROOF_EDITS[edit]
        async with V.working(w):
            with pytest.raises(LeaseLost, match="malformed submission") as lost:  # refused at the door: its task
                await ask(pool, w, PROMPT, 0, 70)                                   # goes to another node
            return str(lost.value), dict(pool.members[w.node].counts)
    lost, counts = run(trusted, tmp_path, body)
    assert counts["rejected:malformed"] == 1 and counts.get("accepted", 0) == 0, lost


def test_a_reported_reward_is_refused_and_charged(trusted, tmp_path):
    async def body(client, pool):
        w = V.make_worker(Worker, pool, tmp_path, "reward")
        async with V.working(w):
            real = w._http.post
            w._http.post = lambda url, json: real(url, json={**json, "reward": 1.0} if url.endswith("/submit") else json)
            with pytest.raises(LeaseLost, match="reward"):
                await ask(pool, w, PROMPT, 0, 70)
            return dict(pool.members[w.node].counts)
    counts = run(trusted, tmp_path, body)
    assert counts["rejected:malformed"] == 1 and counts.get("accepted", 0) == 0


def test_a_forged_signature_or_an_unregistered_key_is_refused_and_charges_no_one(trusted, tmp_path):
    async def body(client, pool):
        victim = V.make_worker(Worker, pool, tmp_path, "victim")
        async with V.working(victim), aiohttp.ClientSession() as http:
            lease_task = asyncio.create_task(pool.lease(victim.node, PROMPT, SamplingParams(max_tokens=40, seed=0), 1))
            lease, sub = await lease_task
            base = f"http://127.0.0.1:{pool.cfg.port}/pool"
            async with http.post(f"{base}/submit", json=asdict(V.forged(sub, victim.node))) as r:
                forged = r.status
            stranger = Ed25519PrivateKey.generate()
            async with http.post(f"{base}/lease", json=hello(stranger, "lease")) as r:
                unregistered = r.status
            async with http.post(f"{base}/submit", json=asdict(dataclasses.replace(sub, node_id=V.node_id(stranger)).signed(stranger))) as r:
                unregistered_submit = r.status
            return forged, unregistered, unregistered_submit, dict(pool.refused), dict(pool.members[victim.node].counts)
    forged, unregistered, unregistered_submit, refused, victim = run(trusted, tmp_path, body)
    assert (forged, unregistered, unregistered_submit) == (403, 403, 403)
    assert refused == {"bad_signature": 1, "unregistered": 2}
    assert not any(k.startswith("rejected:") for k in victim)


def rejections(member) -> int:
    return sum(v for k, v in member.counts.items() if k.startswith("rejected:"))


def test_fuzzed_messages_are_each_one_4xx_or_one_rejection_and_honest_requests_between_them_all_pass(trusted, tmp_path):
    """The property, over generated messages (tests/support/fuzz_volunteers.py: SUBMISSIONS submissions for a
    lease a member holds, PLAUSIBLE more the door lets through to the validator and the trusted server's
    TOPLOC verifier, GREETINGS hellos and joins from the member or a stranger): a message the pool can charge to
    the member (its signature, for its lease) is one rejection, a 422 at the door or a 202 the validator
    rejects; any other is a 4xx and charges no one; the client's request to the member ends in a rejected
    completion or LeaseLost, never another exception; the trusted server answers after each; an honest
    worker's request after every fourth message is accepted. Messages tried per run: printed."""
    bg = F.Background(trusted, tmp_path / "run", tmp_path, probation_accepted=0, eject_after=10**9, rate=10_000.0,
                      burst=10_000, heartbeat_s=30.0)  # the fuzzing member beats only when it asks for a lease
    key, tried, answers = Ed25519PrivateKey.generate(), Counter(), Counter()
    url = f"http://127.0.0.1:{bg.pool.cfg.port}/pool"
    bounded = settings(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    try:
        with httpx.Client(timeout=60) as http:
            assert http.post(f"{url}/join", json=hello(key, "join", token=V.TOKEN)).status_code == 200
            member = bg.pool.members[node_id(key)]

            def then(kind: str, answer: str, before: int, charged: bool) -> None:
                tried[kind] += 1
                answers[answer] += 1
                assert rejections(member) - before == int(charged), answer
                assert httpx.get(f"{trusted[0]}/health").status_code == 200 and bg.thread.is_alive()
                if (tried["greeting"] + tried["submission"]) % 4 == 0:
                    assert bg.call(ask(bg.pool, bg.honest, PROMPT, sum(tried.values()), 16))[2].verdict == ""
                    tried["honest"] += 1

            def submit(data, door_valid: bool) -> None:
                before, seed = rejections(member), sum(tried.values())
                params = SamplingParams(max_tokens=8, seed=seed, stop_token_ids=(EOS,))
                asked = bg.start(VolunteerNode(member.node_id, bg.pool).complete(PROMPT, params, 1))
                lease = http.post(f"{url}/lease", json=hello(key, "lease", wait_s=10.0))
                assert lease.status_code == 200, lease.text
                raw, charged = data.draw(F.submission(key, lease.json(), door_valid))
                r = http.post(f"{url}/submit", content=raw, headers=JSON_BODY)
                if charged:
                    assert r.status_code in (202, 422), (raw[:300], r.status_code, r.text)
                    try:
                        assert asked.result(60)[0].verdict != "" and r.status_code == 202
                    except LeaseLost:
                        assert r.status_code == 422
                else:
                    assert 400 <= r.status_code < 500, (raw[:300], r.status_code, r.text)
                    asked.cancel()
                then("submission", f"submit {r.status_code}{' charged' if charged else ''}", before, charged)

            @settings(bounded, max_examples=SUBMISSIONS)
            @given(st.data())
            def submissions(data):
                submit(data, False)

            @settings(bounded, max_examples=PLAUSIBLE)
            @given(st.data())
            def plausible_submissions(data):
                submit(data, True)

            @settings(bounded, max_examples=GREETINGS)
            @given(st.data())
            def greetings(data):
                before = rejections(member)
                route, raw = data.draw(F.greeting(key))
                status = http.post(f"{url}/{route}", content=raw, headers=JSON_BODY).status_code
                assert 400 <= status < 500, (route, raw[:300], status)
                then("greeting", f"{route} {status}", before, False)
            submissions()
            plausible_submissions()
            greetings()
            assert bg.call(ask(bg.pool, bg.honest, PROMPT, 10**6, 16))[2].verdict == ""
    finally:
        bg.close()
    print(f"volunteer surface fuzz: {dict(tried)} messages tried; answers {dict(sorted(answers.items()))}")
    assert tried["submission"] >= SUBMISSIONS + PLAUSIBLE - 5 and tried["greeting"] >= GREETINGS - 2
    assert tried["honest"] >= 12 and answers["submit 202 charged"] >= 10  # most plausible ones reach the validator

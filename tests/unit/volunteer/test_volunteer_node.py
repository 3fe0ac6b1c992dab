"""`VolunteerNode.complete` (volunteer/node.py), the path every volunteer completion takes from the
client to the validator, with the pool in memory and the trusted server's audit answered in memory
(issue 42: the red-team helper bypassed it, so removing probation or the charge for an
unverifiable submission passed every test). A new node is on probation: a second request while
one is in flight is LeaseLost at once (the client sends it to the next node). A submission no
trusted server can check any more is `Unverifiable` and charged `strike_unverifiable`. An
accepted completion carries the audit's trusted log-probs, not the node's claims (issue 43: a
claim 1.2e-4 per token off passes the 2e-4 tolerance, and the trainer read the claim)."""

import asyncio
import base64
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from composer_prime.config.sampling import SamplingParams
from composer_prime.config.volunteers import VolunteersConfig
from composer_prime.contract.audit import AuditAnswer
from composer_prime.contract.volunteer import Submission, node_id
from composer_prime.contract.weights import Directory
from composer_prime.orchestrator.pool import NodePool
from composer_prime.volunteer.invites import Invites
from composer_prime.volunteer.members import LeaseLost, Member, Unverifiable
from composer_prime.volunteer.node import VolunteerNode
from composer_prime.volunteer.pool import VolunteerPool
from composer_prime.volunteer.validator import Validator

KEY = Ed25519PrivateKey.generate()
NODE = node_id(KEY)
PROOF = base64.b64encode(bytes(i % 255 + 1 for i in range(258))).decode()  # 2 + 2 x top-k 128 bytes
PARAMS = SamplingParams(max_tokens=8, seed=3)
TRUSTED = [-0.25 - 0.01 * i for i in range(8)]
CLAIMED = [x - 1.2e-4 for x in TRUSTED]  # inside float32's 2e-4 tolerance


def measured(**over) -> AuditAnswer:
    return AuditAnswer(**{"weight_version": 4, "dtype": "float32", "logprob_max_err": 1.2e-4, "replay_mismatches": 0,
                          "max_draw_distance": 0.0, "tokens": 8, "logprobs": TRUSTED,
                          "chunks": [{"exp_mismatches": 0, "mant_err_mean": 0.0, "mant_err_median": 0.0}], **over})


def pool(audit_answer: AuditAnswer | None, **cfg) -> VolunteerPool:
    """The pool with one member, NODE, and the real validator over an audit that answers `audit_answer`."""
    p = VolunteerPool(VolunteersConfig(enabled=True, open=True, **cfg), NodePool([]), "t", Directory("/run/weights"),
                      "tiny", Invites(Path("/nonexistent/invites.json")))
    p.members[NODE] = Member(NODE, time.time(), tokens=p.cfg.burst, refilled=time.time())

    async def audit(request):
        return audit_answer
    p.validator, p.served = Validator(p.cfg, p.is_member, audit), lambda: 4
    return p


async def submit(p: VolunteerPool, lease=None, logprobs: list[float] = CLAIMED) -> None:
    """Answer `lease` (else the node's next): 8 tokens, no stop token (the lease's budget filled), signed."""
    lease = lease or await p.members[NODE].queue.get()
    sub = Submission(NODE, lease.lease_id, 4, lease.prompt_sha256, [5] * 8, logprobs, lease.sampling["seed"], [PROOF])
    p.pending[lease.lease_id].future.set_result(sub.signed(KEY))


def test_a_node_on_probation_takes_one_request_at_a_time_through_the_real_node():
    async def go():
        p = pool(measured(), probation_accepted=2)
        node = VolunteerNode(NODE, p)
        first = asyncio.create_task(node.complete([1, 2, 3], PARAMS, 1))
        held = await p.members[NODE].queue.get()  # the first request holds its lease, unanswered
        second = asyncio.create_task(node.complete([1, 2, 3], PARAMS, 1))
        for _ in range(3):
            await asyncio.sleep(0)
        refused = second.done() and isinstance(second.exception(), LeaseLost) and "probation" in str(second.exception())
        second.cancel()
        await submit(p, held)
        return refused, await first, p.members[NODE].counts["leased"]
    refused, done, leased = asyncio.run(go())
    assert refused, "a second request to a node on probation went through"
    assert [c.verdict for c in done] == [""] and leased == 1  # the second never leased anything


def test_a_submission_no_trusted_server_can_check_is_unverifiable_and_charged():
    async def go():
        p = pool(None)
        task = asyncio.create_task(VolunteerNode(NODE, p).complete([1, 2, 3], PARAMS, 1))
        await submit(p)
        with pytest.raises(Unverifiable):
            await task
        return p.members[NODE]
    member = asyncio.run(go())
    assert member.counts["unverifiable"] == 1 and member.strikes == pytest.approx(VolunteersConfig().strike_unverifiable)
    assert member.counts["accepted"] == 0


def test_an_accepted_completion_carries_the_trusted_log_probs_not_the_claimed_ones():
    async def go(answer):
        p = pool(answer)
        task = asyncio.create_task(VolunteerNode(NODE, p).complete([1, 2, 3], PARAMS, 1))
        await submit(p)
        return (await task)[0]
    accepted = asyncio.run(go(measured()))
    assert accepted.verdict == "" and accepted.logprobs == TRUSTED
    assert max(abs(a - b) for a, b in zip(accepted.logprobs, CLAIMED)) == pytest.approx(1.2e-4)
    rejected = asyncio.run(go(measured(logprob_max_err=3e-4)))  # past the tolerance: its group is dropped anyway
    assert rejected.verdict == "logprobs" and rejected.logprobs == CLAIMED

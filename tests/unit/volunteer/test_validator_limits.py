"""The validator's own limits (volunteer/validator.py), with the trusted server's audit answered in
memory: a lease's `max_tokens` is a bound of its own (issue 42: a 12-token completion ending in
its first stop token, on an 8-token lease, passes the boundary rule and was accepted without it),
and a submission of the wrong JSON types is "malformed", never a TypeError in the orchestrator
(issue 43: `logprobs: [null]` and `proofs: [12345]` raised inside the submission check)."""

import asyncio
import base64
import dataclasses

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from composer_prime.config.volunteers import VolunteersConfig
from composer_prime.contract.audit import AuditAnswer
from composer_prime.contract.volunteer import Lease, Submission, node_id
from composer_prime.volunteer.validator import Validator

KEY = Ed25519PrivateKey.generate()
STOP = 7
LEASE = Lease("l1", "env", [1, 2, 3], {"seed": 9, "max_tokens": 8, "stop_token_ids": [STOP]}, 4, 0.0)
PROOF = base64.b64encode(bytes(i % 255 + 1 for i in range(258))).decode()  # 2 + 2 x top-k 128 bytes, modulus 0x0102


def clean(tokens: int) -> AuditAnswer:
    return AuditAnswer(weight_version=4, dtype="float32", chunks=[{"exp_mismatches": 0, "mant_err_mean": 0.0,
                                                                   "mant_err_median": 0.0}] * -(-tokens // 32),
                       logprob_max_err=0.0, replay_mismatches=0, max_draw_distance=0.0, tokens=tokens,
                       logprobs=[-0.5] * tokens)


def verdict(ids: list, **fields) -> tuple[str, int]:
    """The validator's verdict on a signed submission of `ids` (fields replaced as given), and the audits it asked for."""
    audits = []

    async def audit(request):
        audits.append(request)
        return clean(len(ids))
    sub = Submission(node_id(KEY), "l1", 4, LEASE.prompt_sha256, ids, [-0.5] * len(ids), 9, [PROOF] * -(-len(ids) // 32))
    sub = dataclasses.replace(sub, **fields).signed(KEY)
    return asyncio.run(Validator(VolunteersConfig(), lambda node: True, audit).check(LEASE, sub)), len(audits)


def test_a_completion_past_the_leases_max_tokens_is_malformed_though_it_ends_in_its_first_stop_token():
    assert verdict([5] * 7 + [STOP]) == ("", 1)  # 8 tokens, ending in the stop token: audited, accepted
    assert verdict([5] * 8) == ("", 1)  # no stop token, filling the lease's 8
    assert verdict([5] * 11 + [STOP]) == ("malformed", 0)  # 12 on an 8-token lease: no prefill spent on it
    assert verdict([5] * 9) == ("malformed", 0)


@pytest.mark.parametrize("fields", [
    {"logprobs": [None] * 8}, {"proofs": [12345]}, {"logprobs": ["-0.5"] * 8}, {"token_ids": [5.0] * 7 + [STOP]},
    {"token_ids": [True] * 7 + [STOP]}, {"proofs": [[PROOF]]}, {"proofs": PROOF}, {"logprobs": {"0": -0.5}},
    {"weight_version": 4.0}, {"seed": 9.0}, {"token_ids": None}, {"logprobs": [-0.5] * 7 + [float("-inf")]},
])
def test_wrong_json_types_are_malformed_never_an_exception(fields):
    """Each passes the checks before it (4.0 == 4, 9.0 == 9) and is refused, before any prefill."""
    assert verdict([5] * 7 + [STOP], **fields) == ("malformed", 0)


def test_a_node_id_or_signature_of_the_wrong_type_is_a_bad_signature_never_an_exception():
    sub = Submission(node_id(KEY), "l1", 4, LEASE.prompt_sha256, [5] * 7 + [STOP], [-0.5] * 8, 9, [PROOF]).signed(KEY)
    for bad in ({"node_id": 12345}, {"node_id": ["ab"]}, {"signature": None}, {"signature": {"a": 1}}):
        assert not dataclasses.replace(sub, **bad).signature_valid(), bad

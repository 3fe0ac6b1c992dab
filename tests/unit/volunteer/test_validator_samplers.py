"""The validator's branch on a submission's sampler (volunteer/validator.py), with the
trusted server's audit answered in memory: a sampler the run does not accept is refused before any
prefill; seeded draws are judged by the replay's distance alone, any other sampler's by the
statistics alone (verify/sampling.py), each at the thresholds of the audit's dtype."""

import asyncio
import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from composer_prime.config.volunteers import VolunteersConfig
from composer_prime.contract.volunteer import CHUNK, Lease, Submission, node_id
from composer_prime.contract.audit import AuditAnswer
from composer_prime.volunteer.validator import Validator

KEY = Ed25519PrivateKey.generate()
LEASE = Lease("l1", "env", [1, 2, 3], {"seed": 9, "max_tokens": 8}, 4, 0.0)
CLEAN = {"weight_version": 4, "replay_mismatches": 0, "tokens": 8, "dtype": "float32", "chunks": [{"exp_mismatches": 0, "mant_err_mean": 0.0, "mant_err_median": 0.0}],
         "logprob_max_err": 0.0, "max_draw_distance": 0.0, "min_pvalue": 1.0, "surprisal_z": 0.0, "logprobs": [-0.5] * 8}
PROOF = base64.b64encode(bytes(i % 255 + 1 for i in range(258))).decode()  # 258 bytes (2 + 2 x top-k 128), modulus 0x0102


def verdict(sampler: str, measured: dict, **cfg) -> tuple[str, int]:
    audits = []

    async def audit(body):
        audits.append(body)
        return AuditAnswer(**{**CLEAN, **measured})
    v = Validator(VolunteersConfig(**cfg), lambda node: True, audit)
    sub = Submission(node_id(KEY), "l1", 4, LEASE.prompt_sha256, [5] * 8, [-0.5] * 8, 9, [PROOF] * (8 // CHUNK + 1),
                     sampler).signed(KEY)
    return asyncio.run(v.check(LEASE, sub)), len(audits)


BOTH = {"samplers": ["seeded", "any"]}


@pytest.mark.parametrize("sampler", ["seeded", "any"])
def test_clean_measurements_pass_either_sampler_the_run_accepts(sampler):
    assert verdict(sampler, {}, **BOTH) == ("", 1)


def test_a_sampler_the_run_refuses_costs_no_prefill():
    assert verdict("any", {}) == ("sampler", 0)  # by default only draws that replay
    assert verdict("nucleus", {}, **BOTH) == ("sampler", 0)  # not one the contract knows


def test_seeded_draws_are_judged_by_the_replay_and_other_samplers_by_the_statistics():
    far, improbable, picked = {"max_draw_distance": 0.5}, {"min_pvalue": 5e-5}, {"surprisal_z": -4.6}
    assert [verdict("seeded", m)[0] for m in (far, improbable, picked)] == ["sampling", "", ""]
    assert [verdict("any", m, **BOTH)[0] for m in (far, improbable, picked)] == ["", "sampling", "sampling"]
    # at the thresholds themselves: passes (1e-4, -4.5)
    assert verdict("any", {"min_pvalue": 1e-4, "surprisal_z": -4.5}, **BOTH)[0] == ""

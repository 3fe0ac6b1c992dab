"""The wire contract with a volunteer's node (contract/volunteer.py): the prompt bound by hash, a
submission signed over canonical bytes (any changed field breaks the signature; another key, a
garbage signature: invalid, never an exception), and the shape checks a validator runs before
any cost, a null TOPLOC proof included; a request body parsed strictly and a submission typed and
bounded by its lease before anything reads it (issue 43; the door's use of it: tests/unit/volunteer/
test_door_schema.py)."""

import base64
import dataclasses

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from composer_prime.contract.batches import SchemaError
from composer_prime.contract.volunteer import Lease, Submission, check_submission, prompt_hash

PROOF = base64.b64encode(bytes(i % 255 + 1 for i in range(258))).decode()  # 258 bytes: 2 + 2 x topk 128


def node_id(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def submission(key: Ed25519PrivateKey, n: int = 40) -> Submission:
    lease = Lease("L1", "reverse-text", [1, 2, 3], {"seed": 7, "temperature": 1.0}, 4, 1e12)
    return Submission(node_id(key), lease.lease_id, 4, lease.prompt_sha256, list(range(n)), [-0.5] * n, 7,
                      [PROOF] * -(-n // 32)).signed(key)


def test_the_prompt_is_bound_by_hash():
    assert prompt_hash([1, 2, 3]) == prompt_hash([1, 2, 3]) != prompt_hash([1, 2, 4])
    assert prompt_hash([1, 2, 3]) == "a615eeaee21de5179de080de8c3052c8da901138406ba71c38c032845f7d54f4"


def test_any_changed_field_breaks_the_signature():
    key = Ed25519PrivateKey.generate()
    s = submission(key)
    assert s.signature_valid()
    for change in ({"token_ids": [0] + s.token_ids[1:] + [9]}, {"weight_version": 5}, {"seed": 8}, {"lease_id": "L2"},
                   {"prompt_sha256": prompt_hash([1, 2, 4])}, {"logprobs": [-0.4] + s.logprobs[1:]}, {"proofs": [PROOF[::-1]] * 2}):
        assert not dataclasses.replace(s, **change).signature_valid(), change
    other = Ed25519PrivateKey.generate()
    assert not dataclasses.replace(s, node_id=node_id(other)).signature_valid()  # a key that did not sign
    assert not dataclasses.replace(s, signature="zz").signature_valid() and not dataclasses.replace(s, signature="").signature_valid()


@pytest.mark.parametrize("change,why", [
    ({"logprobs": [-0.5] * 39}, "40 tokens and 39 log-probs"),
    ({"logprobs": [0.5] * 40}, "log-probs must be finite and at most 0"),
    ({"proofs": [PROOF]}, "1 proofs for 40 tokens"),
    ({"proofs": [PROOF, "not base64!"]}, "a proof is not base64"),
    ({"proofs": [PROOF, base64.b64encode(bytes(258)).decode()]}, "a null proof"),
    ({"proofs": [PROOF, base64.b64encode(base64.b64decode(PROOF)[:256]).decode()]}, r"proofs of \[256, 258\] bytes: all of one top-k"),
    ({"proofs": [PROOF, base64.b64encode(b"\0\0" + bytes(range(1, 129)) * 2).decode()]}, "modulus 0"),
    ({"logprobs": [None] * 40}, "log-probs must be finite"),
    ({"token_ids": list(range(39)) + [2**31]}, "token_ids: a list of token ids"),
])
def test_malformed_submissions_are_refused_before_any_cost(change, why):
    s = submission(Ed25519PrivateKey.generate())
    check_submission(s)
    with pytest.raises(SchemaError, match=why):
        check_submission(dataclasses.replace(s, **change))


def test_a_hello_is_bound_to_its_node_route_and_time():
    from composer_prime.contract.volunteer import hello, hello_valid

    key = Ed25519PrivateKey.generate()
    h = hello(key, "lease", wait_s=5.0)
    assert hello_valid(h, "lease") and h["node_id"] == node_id(key)
    assert not hello_valid(h, "heartbeat")  # another route
    assert not hello_valid({**h, "wait_s": 6.0}, "lease")  # a changed field
    assert not hello_valid({**h, "node_id": node_id(Ed25519PrivateKey.generate())}, "lease")  # another node's name
    stale = hello(key, "lease")
    stale_time = {**stale, "time": stale["time"] - 120}
    assert not hello_valid(stale_time, "lease")
    assert not hello_valid({"route": "lease"}, "lease")  # fields missing: invalid, never an exception


def test_a_submission_is_parsed_against_its_lease():
    from composer_prime.contract.volunteer import parse_submission

    lease = Lease("L1", "reverse-text", [1, 2, 3], {"seed": 7, "max_tokens": 40}, 4, 1e12)
    body = dataclasses.asdict(submission(Ed25519PrivateKey.generate()))
    assert parse_submission(body, lease) == Submission(**body)
    for bad, why in (({**body, "reward": 1.0}, r"a submission has no \['reward'\].*computes rewards itself"),
                     ({k: v for k, v in body.items() if k != "proofs"}, r"needs \['proofs'\]"), ([body], "a JSON object")):
        with pytest.raises(SchemaError, match=why):
            parse_submission(bad, lease)
    with pytest.raises(SchemaError, match="41 tokens"):
        parse_submission(dataclasses.asdict(submission(Ed25519PrivateKey.generate(), 41)), lease)


@pytest.mark.parametrize("raw,why", [(b'{"a": NaN}', "NaN is not JSON"), (b"[" * 100_000, "nested too deeply"),
                                     (b"1" * 5000, "not JSON"), (b"\xff", "not JSON"), (b'{"a": 1', "not JSON")])
def test_a_body_is_strict_json_or_a_schema_error(raw, why):
    from composer_prime.contract.volunteer import loads

    with pytest.raises(SchemaError, match=why):
        loads(raw)

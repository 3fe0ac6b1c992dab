"""`toploc.measure` hands TOPLOC's native verifier only proofs it can read (verify/toploc.py;
issue 43: a zero modulus killed the trusted server with SIGFPE, a 2-byte proof with SIGSEGV, and
a proof past the last chunk aborts its threads). Each crafted proof is a ValueError before the
native call, which a spy stands in for, so a guard that let one through fails here instead of
killing the test's worker; honest proofs reach it as their decoded bytes."""

import base64

import pytest
import torch

from composer_prime.verify import toploc

b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
STATES = torch.randn(40, 128, generator=torch.Generator().manual_seed(0))  # two chunks: 32 + 8 tokens
GOOD = b64(b"\1\1" + b"\0\1" * 128)  # 2 + 2 x top-k 128 bytes, modulus 257
CRAFTED = {
    "zero modulus": ([b64(b"\0\0" + b"\0\1" * 128), GOOD], "modulus 0"),
    "2 bytes": ([b64(b"\0\1"), GOOD], "a proof of 2 bytes"),
    "another top-k": ([b64(b"\1\1" + b"\0\1" * 127), GOOD], r"a proof of 256 bytes: 2 \+ 2 x top-k \(128\)"),
    "one proof past the last chunk": ([GOOD] * 3, "3 proofs for 40 tokens"),
    "one short": ([GOOD], "1 proofs for 40 tokens"),
    "not base64": (["%%%%", GOOD], "not base64"),
    "a verifier-only decoding": ([GOOD[:4] + "=" + GOOD[5:], GOOD], "not base64"),  # the C++ decoder stops at "="
    "megabytes": ([b64(b"\1\1" + b"\0\1" * 500_000), GOOD], "at most 344 characters"),
    "not a list": (GOOD, "no list of proofs"),
}


@pytest.fixture
def native(monkeypatch) -> list:
    """The native verifier's calls (a spy answering nothing)."""
    calls: list = []
    real, _ = toploc.require()
    monkeypatch.setattr(toploc, "require", lambda: (real, lambda *args: calls.append(args) or []))
    return calls


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_proof_the_native_verifier_cannot_read_never_reaches_it(native, case):
    proofs, why = CRAFTED[case]
    with pytest.raises(ValueError, match=why):
        toploc.measure(STATES, proofs)
    assert native == []


def test_honest_proofs_reach_it_as_their_bytes(native):
    proofs = toploc.build(STATES)
    toploc.measure(STATES, proofs)
    (_, raw, chunk, topk), = native
    assert raw == [base64.b64decode(p) for p in proofs] and (chunk, topk) == (32, 128)

"""TOPLOC proofs (Ong et al., arXiv 2501.16007) over a completion's last hidden states.

A node proves which model produced a completion by committing to the hidden states that fed the
LM head: for every chunk of `CHUNK` (32) completion tokens, the `TOPK` largest |values| of the
chunk's bf16 states, encoded as a polynomial through (flat index, value) and sent as base64 (2 +
2·topk bytes). The validator recomputes the states with one prefill of prompt + completion under
the trusted weights and compares, per chunk, the exponents and mantissas of the committed values:

    exp_mismatches  = #{i in top-k : exponent(trusted_i) != exponent(claimed_i)}
    mant_err_mean   = mean_i |mantissa(trusted_i) - mantissa(claimed_i)|   (and the median)

A chunk passes when all three are within the run's thresholds (`VolunteersConfig.chunk_passes`,
calibrated on our models; the paper's are 38 / 10 / 8 at topk 128). The prompt is not proven here (one changed prompt token still passes the
paper's thresholds on a toy model): the lease binds it by hash (contract/volunteer.py).

toploc 0.1.6 returns null proofs when building fails and applies no threshold; both are handled
here. Its Python verification path ignores each proof's modulus, so only its C++ path (a 2-D
tensor, `skip_prefill=True`) is used. toploc is installed by `composer-prime toploc install` (verify/install.py).

That C++ path trusts its input: it divides by each proof's modulus (a zero one: SIGFPE), reads the
last of its coefficients (none: SIGSEGV), and runs in threads where any exception (a proof past the
last chunk) aborts the process. An untrusted proof would kill the trusted server that verifies it
(issue 43), so `measure` hands it nothing it has not checked: one proof per chunk, each exactly
2 + 2·topk bytes of canonical base64 with a nonzero modulus (contract/volunteer.decode_proof), and
passes the decoded bytes, not the base64, so the verifier's own lenient decoder never reads them.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import torch

from composer_prime.contract.volunteer import CHUNK, TOPK, decode_proof, proofs_for


class ProofError(RuntimeError):
    """Proofs could not be built (toploc fell back to null proofs) or toploc is missing."""


def require():
    """toploc and its verifier; ProofError, naming the install command, where it is not installed."""
    try:
        import toploc
        from toploc.C.csrc.poly import verify_proofs_bytes
    except ImportError as e:
        raise ProofError(f"TOPLOC is not installed ({e}): run `uv run composer-prime toploc install`") from None
    return toploc, verify_proofs_bytes


def topk_for(hidden_size: int) -> int:
    """Top-k that every chunk can supply, a one-token last chunk included."""
    return min(TOPK, hidden_size)


def build(states: torch.Tensor) -> list[str]:
    """Proofs for completion states [N, H] (one row per generated token), one per CHUNK rows."""
    toploc, _ = require()
    k = topk_for(states.shape[-1])
    rows = list(states.detach().to("cpu", torch.bfloat16).contiguous())
    proofs = toploc.build_proofs_base64(rows, CHUNK, k, skip_prefill=True)
    if any(not base64.b64decode(p).strip(b"\0") for p in proofs) or len(proofs) != proofs_for(len(rows)):
        raise ProofError(f"toploc returned null proofs for {len(rows)} states of width {states.shape[-1]}")
    return proofs


@dataclass(frozen=True)
class ChunkCheck:
    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float


def measure(states: torch.Tensor, proofs: list[str]) -> list[ChunkCheck]:
    """Each proof against the trusted states [N, H] of the same completion tokens; ValueError, before
    TOPLOC's native code sees anything, for proofs it cannot safely read (module docstring)."""
    _, verify = require()
    if states.dim() != 2 or not len(states):
        raise ValueError(f"states of shape {tuple(states.shape)}: one row per completion token")
    if not isinstance(proofs, list) or len(proofs) != proofs_for(len(states)):
        raise ValueError(f"{len(proofs) if isinstance(proofs, list) else 'no list of'} proofs for {len(states)} "
                         f"tokens (one per {CHUNK})")
    k = topk_for(states.shape[-1])
    raw = [decode_proof(p, k) for p in proofs]  # SchemaError, a ValueError
    trusted = states.detach().to("cpu", torch.bfloat16).contiguous()
    return [ChunkCheck(int(r.exp_mismatches), float(r.mant_err_mean), float(r.mant_err_median))
            for r in verify(trusted, raw, CHUNK, k)]


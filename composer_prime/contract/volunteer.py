"""What crosses between a run and a volunteer's inference node: the lease it is given and the
signed submission it returns, and the pool's answer to a join (issue 27's worker and validator
read only these).

A `Lease` is chosen by the run's pool, never by the node: the task (its prompt, bound by hash),
the sampling parameters and seed, the weight version to generate with (the trusted servers'
when the lease is made: the validator's prefill runs with those weights), a deadline. A `Submission`
is what the node generated for it: the token ids, its sampling log-probs, the weight version it
used, TOPLOC proofs over its last hidden states (one per 32-token chunk, base64), the sampler it
drew with (`SAMPLERS`: whether the validator can replay its draws), signed with the node's ed25519 key over `signed_bytes()` (canonical JSON of every other field). The node never
reports a reward: the run recomputes it. A node's other requests (join, heartbeat, lease) are a
`hello`: its id, the route and the time, signed, so nobody can beat or take leases for another
node. Torch-free, so a volunteer installs inference only.

Everything a volunteer sends is untrusted, so it is typed and bounded here before anything else
reads it (issue 43): `loads` (strict JSON), `parse_submission` (every field's type, the token
count within the lease's `max_tokens`, one proof per chunk, each proof exactly 2 + 2k bytes of
canonical base64 with a nonzero modulus: TOPLOC's native verifier divides by the modulus and reads
the last coefficient, so a zero one or an empty list kills the process that verifies it). A wrong
JSON type is a SchemaError, never a TypeError.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import time
from dataclasses import asdict, dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from composer_prime.contract.batches import SchemaError
from composer_prime.contract.weights import WeightsSource, from_json, to_json

CHUNK = 32  # tokens per TOPLOC proof (INTELLECT-2's and prime-rl's boundary)
TOPK = 128  # values a proof commits per chunk (the paper's and INTELLECT-2's choice; a narrower model: its width)
PROOF_MAX_BYTES = 2 + 2 * TOPK  # a modulus and TOPK coefficients, 16 bits each: 258 bytes
PROOF_MAX_CHARS = 4 * -(-PROOF_MAX_BYTES // 3)  # its base64: 344 characters
MAX_TOKEN_ID = 2**31 - 1
MAX_INT = 2**63 - 1  # seeds and versions: what an int64 holds
_HEX = re.compile("[0-9a-f]*")
SAMPLERS = ("seeded", "any")  # the embedded engine's seeded draws (replayed exactly); any other (vLLM's: tested)


@dataclass(frozen=True)
class JoinAnswer:
    """The pool's answer to a join: what to serve, in which dtype, where its weights are, how often to beat."""

    model: str  # a model name the worker resolves (tiny, smollm2-135m, a hub id, a GGUF file)
    weights: WeightsSource
    heartbeat_s: float
    dtype: str  # what the worker generates and the audits prefill in (volunteers.dtype)

    def to_json(self) -> dict:
        return {**asdict(self), "weights": to_json(self.weights)}

    @classmethod
    def from_json(cls, body: object) -> "JoinAnswer":
        """SchemaError for a body that is not a join answer (a wrong server, a newer run)."""
        if not isinstance(body, dict):
            raise SchemaError(f"a join answer is an object, not {type(body).__name__}")
        try:
            return cls(str(body["model"]), from_json(body["weights"]), float(body["heartbeat_s"]), str(body["dtype"]))
        except (KeyError, TypeError, ValueError) as e:
            raise SchemaError(f"not a join answer: {e!r}") from None


def prompt_hash(prompt_ids: list[int]) -> str:
    """sha256 of the prompt's token ids, as the lease binds them (a changed token is another prompt)."""
    return hashlib.sha256(json.dumps(prompt_ids, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Lease:
    lease_id: str
    env: str
    prompt_ids: list[int]
    sampling: dict  # SamplingParams as JSON, its seed included
    weight_version: int  # generate with exactly these weights (pull them first if behind)
    deadline: float  # unix time; a later submission is discarded and the task leased again

    @property
    def prompt_sha256(self) -> str:
        return prompt_hash(self.prompt_ids)


@dataclass(frozen=True)
class Submission:
    node_id: str  # the node's ed25519 public key, hex
    lease_id: str
    weight_version: int
    prompt_sha256: str
    token_ids: list[int]
    logprobs: list[float]  # the sampling log-prob of each token
    seed: int
    proofs: list[str] = field(default_factory=list)  # base64 TOPLOC proofs, one per CHUNK tokens
    sampler: str = "seeded"  # one of SAMPLERS
    signature: str = ""  # hex ed25519 signature of signed_bytes()

    def signed_bytes(self) -> bytes:
        return _canonical({k: v for k, v in asdict(self).items() if k != "signature"})

    def signed(self, key: Ed25519PrivateKey) -> "Submission":
        return Submission(**{**asdict(self), "signature": key.sign(self.signed_bytes()).hex()})

    def signature_valid(self) -> bool:
        return _verify(self.node_id, self.signature, self.signed_bytes())


def node_id(key: Ed25519PrivateKey) -> str:
    """A node's id: its ed25519 public key, hex."""
    return key.public_key().public_bytes_raw().hex()


def _canonical(fields: dict) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def _verify(node: object, signature: object, data: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(node)).verify(bytes.fromhex(signature), data)
        return True
    except (ValueError, TypeError, InvalidSignature):  # TypeError: a node id or signature that is no string
        return False


def submission_signed(body: dict) -> bool:
    """`body` (a submission as received) is signed by the node it names, over the submission's fields it
    has (a field a submission has not, a reported reward say, is no part of what a node signs)."""
    fields = {k: body[k] for k in Submission.__dataclass_fields__ if k in body and k != "signature"}
    return _verify(body.get("node_id"), body.get("signature"), _canonical(fields))


def hello(key: Ed25519PrivateKey, route: str, **fields) -> dict:
    """A signed request body for `route` (join, heartbeat, lease): who, where, when."""
    body = {"node_id": node_id(key), "route": route, "time": time.time(), **fields}
    return {**body, "signature": key.sign(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hex()}


def hello_valid(body: dict, route: str, max_age_s: float = 60.0) -> bool:
    """A hello signed by its node for this route, made within `max_age_s` (a replayed one expires)."""
    fields = {k: v for k, v in body.items() if k != "signature"}
    try:
        fresh = body.get("route") == route and abs(time.time() - float(body["time"])) <= max_age_s
        return fresh and _verify(str(body["node_id"]), str(body["signature"]), _canonical(fields))
    except (KeyError, TypeError, ValueError, AttributeError):  # AttributeError: a body that is no object
        return False


def loads(raw: bytes) -> object:
    """A request body's JSON, strictly (UTF-8, no NaN or Infinity, no integer of over 4,300 digits, nesting
    no deeper than Python's parser goes); SchemaError otherwise."""
    def constant(name: str):
        raise SchemaError(f"{name} is not JSON")
    try:
        return json.loads(raw, parse_constant=constant)
    except RecursionError:
        raise SchemaError("JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer too long to read
        raise SchemaError(f"not JSON: {e}") from None


def _hex(v: object, digits: int) -> bool:
    return isinstance(v, str) and len(v) == digits and _HEX.fullmatch(v) is not None


def _int(v: object, lo: int, hi: int) -> bool:
    return type(v) is int and lo <= v <= hi  # a bool is no int here


def _finite(v: object) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def proofs_for(tokens: int) -> int:
    """Proofs a completion of `tokens` tokens has: one per CHUNK."""
    return -(-tokens // CHUNK)


def submission_max_bytes(max_tokens: int) -> int:
    """The largest body an honest submission for a lease of `max_tokens` is (a token id, its log-prob's
    longest repr and separators are under 64 bytes; a proof and its quotes under PROOF_MAX_CHARS + 8):
    the door reads no more before it parses."""
    return 4096 + 64 * max_tokens + (PROOF_MAX_CHARS + 8) * proofs_for(max_tokens)


def decode_proof(p: object, topk: int | None = None) -> bytes:
    """A proof's bytes, safe for TOPLOC's native verifier: canonical base64 (what Python and the
    verifier's own decoder read alike) of 2 + 2k bytes, k = `topk` (any from 1 to TOPK where None: the
    width is the model's, which only the trusted server knows), a nonzero modulus, not a null proof.
    SchemaError otherwise."""
    if not isinstance(p, str) or len(p) > PROOF_MAX_CHARS:
        raise SchemaError(f"a proof is a base64 string of at most {PROOF_MAX_CHARS} characters")
    try:
        raw = base64.b64decode(p, validate=True)
    except ValueError:
        raise SchemaError("a proof is not base64") from None
    if base64.b64encode(raw).decode() != p:
        raise SchemaError("a proof is not canonical base64")
    if not raw.strip(b"\0"):
        raise SchemaError("a null proof (TOPLOC returns those when building failed)")
    k, odd = divmod(len(raw) - 2, 2)
    if odd or not 1 <= k <= TOPK or topk is not None and k != topk:
        raise SchemaError(f"a proof of {len(raw)} bytes: 2 + 2 x top-k ({topk or f'1 to {TOPK}'}) bytes")
    if raw[:2] == b"\0\0":
        raise SchemaError("a proof with modulus 0 (TOPLOC's verifier divides by it)")
    return raw


def parse_submission(body: object, lease: Lease) -> Submission:
    """The submission in `body` (a request's JSON) for `lease`: every field present and of its type, at
    most the lease's `max_tokens` tokens (check_submission); SchemaError otherwise."""
    if not isinstance(body, dict):
        raise SchemaError(f"a submission is a JSON object, not {type(body).__name__}")
    fields = set(Submission.__dataclass_fields__)
    if extra := sorted(set(body) - fields):
        raise SchemaError(f"a submission has no {extra} (a node reports no reward: the run computes rewards itself)")
    if missing := sorted(fields - set(body)):
        raise SchemaError(f"a submission needs {missing}")
    sub = Submission(**body)
    check_submission(sub, lease.sampling.get("max_tokens"))
    return sub


def check_submission(s: Submission, max_tokens: int | None = None) -> None:
    """SchemaError unless the submission is well formed (what a validator checks before any cost): each
    field of its type and size, with `max_tokens` at most that many tokens, one proof per CHUNK tokens,
    each decode_proof's and all of one width."""
    where = f"submission {str(s.lease_id)[:64]}"
    if not _hex(s.node_id, 64) or not _hex(s.prompt_sha256, 64) or not _hex(s.signature, 128):
        raise SchemaError(f"{where}: node_id, prompt_sha256, signature: 64, 64 and 128 lowercase hex digits")
    if not isinstance(s.lease_id, str) or not 0 < len(s.lease_id) <= 64:
        raise SchemaError(f"{where}: lease_id: a string of 1 to 64 characters")
    if not _int(s.weight_version, 0, MAX_INT) or not _int(s.seed, -MAX_INT - 1, MAX_INT):
        raise SchemaError(f"{where}: weight_version and seed are 64-bit integers")
    if not isinstance(s.sampler, str) or s.sampler not in SAMPLERS:
        raise SchemaError(f"{where}: sampler {str(s.sampler)[:32]!r} is not one of {SAMPLERS}")
    ids, lps, proofs = s.token_ids, s.logprobs, s.proofs
    if not isinstance(ids, list) or not all(_int(t, 0, MAX_TOKEN_ID) for t in ids):
        raise SchemaError(f"{where}: token_ids: a list of token ids (integers from 0 to {MAX_TOKEN_ID})")
    if not ids or max_tokens is not None and len(ids) > max_tokens:
        raise SchemaError(f"{where}: {len(ids)} tokens (from 1 to the lease's max_tokens, {max_tokens})")
    if not isinstance(lps, list) or len(lps) != len(ids):
        raise SchemaError(f"{where}: {len(ids)} tokens and {len(lps) if isinstance(lps, list) else 'no list of'} log-probs")
    if not all(_finite(x) and x <= 0 for x in lps):
        raise SchemaError(f"{where}: log-probs must be finite and at most 0")
    if not isinstance(proofs, list) or len(proofs) != proofs_for(len(ids)):
        raise SchemaError(f"{where}: {len(proofs) if isinstance(proofs, list) else 'no list of'} proofs for "
                          f"{len(ids)} tokens (one per {CHUNK})")
    try:
        widths = {len(decode_proof(p)) for p in proofs}
    except SchemaError as e:
        raise SchemaError(f"{where}: {e}") from None
    if len(widths) > 1:
        raise SchemaError(f"{where}: proofs of {sorted(widths)} bytes: all of one top-k")

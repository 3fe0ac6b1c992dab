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
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from composer_prime.contract.batches import SchemaError
from composer_prime.contract.weights import WeightsSource, from_json, to_json

CHUNK = 32  # tokens per TOPLOC proof (INTELLECT-2's and prime-rl's boundary)
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
        body = {k: v for k, v in asdict(self).items() if k != "signature"}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def signed(self, key: Ed25519PrivateKey) -> "Submission":
        return Submission(**{**asdict(self), "signature": key.sign(self.signed_bytes()).hex()})

    def signature_valid(self) -> bool:
        return _verify(self.node_id, self.signature, self.signed_bytes())


def node_id(key: Ed25519PrivateKey) -> str:
    """A node's id: its ed25519 public key, hex."""
    return key.public_key().public_bytes_raw().hex()


def _verify(node: str, signature: str, data: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(node)).verify(bytes.fromhex(signature), data)
        return True
    except (ValueError, InvalidSignature):
        return False


def hello(key: Ed25519PrivateKey, route: str, **fields) -> dict:
    """A signed request body for `route` (join, heartbeat, lease): who, where, when."""
    body = {"node_id": node_id(key), "route": route, "time": time.time(), **fields}
    return {**body, "signature": key.sign(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hex()}


def hello_valid(body: dict, route: str, max_age_s: float = 60.0) -> bool:
    """A hello signed by its node for this route, made within `max_age_s` (a replayed one expires)."""
    fields = {k: v for k, v in body.items() if k != "signature"}
    try:
        fresh = body.get("route") == route and abs(time.time() - float(body["time"])) <= max_age_s
        data = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
        return fresh and _verify(str(body["node_id"]), str(body["signature"]), data)
    except (KeyError, TypeError, ValueError):
        return False


def check_submission(s: Submission) -> None:
    """SchemaError unless the submission is well formed (what a validator checks before any cost)."""
    if not s.token_ids or len(s.logprobs) != len(s.token_ids):
        raise SchemaError(f"submission {s.lease_id}: {len(s.token_ids)} tokens and {len(s.logprobs)} log-probs")
    if not all(math.isfinite(x) and x <= 0 for x in s.logprobs):
        raise SchemaError(f"submission {s.lease_id}: log-probs must be finite and at most 0")
    if s.sampler not in SAMPLERS:
        raise SchemaError(f"submission {s.lease_id}: sampler {s.sampler!r} is not one of {SAMPLERS}")
    if len(s.proofs) != math.ceil(len(s.token_ids) / CHUNK):
        raise SchemaError(f"submission {s.lease_id}: {len(s.proofs)} proofs for {len(s.token_ids)} tokens "
                          f"(one per {CHUNK})")
    for p in s.proofs:
        try:
            raw = base64.b64decode(p, validate=True)
        except ValueError:
            raise SchemaError(f"submission {s.lease_id}: a proof is not base64") from None
        if not raw.strip(b"\0"):
            raise SchemaError(f"submission {s.lease_id}: a null proof (TOPLOC returns those when building failed)")

"""The trainer-signed manifest of one published step, and the ed25519 keys behind it.

The manifest names every shard with its size and blake3 hash, and the whole payload's hash.
It is canonical JSON signed with the trainer's private key, so it may travel through any
untrusted relay: a client holding the trainer's public key checks the signature first and then
every shard against it. Nothing else a server says (distribution.txt, headers) is trusted.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

FORMAT = "composer-prime-shardcast/1"


class VerificationError(Exception):
    """A manifest, signature or shard that must not be used."""


@dataclass(frozen=True)
class Shard:
    name: str  # e.g. "shard_00001.bin", the SHARDCAST file name
    size: int
    blake3: str


@dataclass(frozen=True)
class Delta:
    """`name` turns the payload of `base_step` into this step's payload (see payload.encode_delta)."""

    base_step: int
    name: str  # e.g. "delta_from_00041.bin"
    size: int
    blake3: str
    stride: int  # bytes per weight element: 2 for bf16, 4 for fp32


@dataclass(frozen=True)
class Manifest:
    step: int
    model_hash: str  # blake3 of the model's config.json: a step for another model is refused
    total_size: int
    total_blake3: str  # the same value SHARDCAST's distribution.txt carries
    shards: tuple[Shard, ...]
    delta: Delta | None = None
    format: str = FORMAT

    def to_bytes(self) -> bytes:
        body = asdict(self)
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "Manifest":
        try:
            body = json.loads(raw)
            if body.get("format") != FORMAT:
                raise VerificationError(f"unknown manifest format {body.get('format')!r}")
            shards = tuple(Shard(**s) for s in body.pop("shards"))
            delta = Delta(**body.pop("delta")) if body.get("delta") else None
            body.pop("delta", None)
            m = cls(shards=shards, delta=delta, **body)
        except (ValueError, TypeError, KeyError) as e:
            raise VerificationError(f"malformed manifest: {e}") from None
        if sum(s.size for s in m.shards) != m.total_size:
            raise VerificationError("manifest shard sizes do not add up to its total size")
        return m


def sign(manifest: Manifest, key: Ed25519PrivateKey) -> bytes:
    return key.sign(manifest.to_bytes())


def verify(raw: bytes, signature: bytes, public_key_hex: str) -> Manifest:
    """The manifest in `raw` if `signature` is the trainer's over exactly these bytes; else raise."""
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key_hex)).verify(signature, raw)
    except (InvalidSignature, ValueError) as e:
        raise VerificationError(f"bad manifest signature ({type(e).__name__})") from None
    return Manifest.from_bytes(raw)


def load_or_create_key(path: Path) -> Ed25519PrivateKey:
    """The trainer's signing key at `path` (raw 32 bytes, mode 0600), created on first use."""
    if path.exists():
        return Ed25519PrivateKey.from_private_bytes(path.read_bytes())
    key = Ed25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(raw)
    os.replace(path.with_suffix(".tmp"), path)
    return key


def public_hex(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()

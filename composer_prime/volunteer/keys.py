"""A worker's identity: one ed25519 key, made on first start and kept (mode 0600). Its public half,
hex, is the node id the run knows it by; every request it makes is signed with it."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def load_or_make(path: Path) -> Ed25519PrivateKey:
    """The key at `path` (32 raw bytes, hex), made there first if absent; ValueError if unreadable."""
    path = path.expanduser()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key.private_bytes_raw().hex())
        return key
    try:
        return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(path.read_text().strip()))
    except ValueError:
        raise ValueError(f"{path} is not an ed25519 key (64 hex digits): move it away to make a new one") from None

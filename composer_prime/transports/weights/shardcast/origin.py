"""The origin: inside the trainer, publishes each step in the SHARDCAST layout, signed, and serves it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from composer_prime.transports.weights.shardcast import payload
from composer_prime.transports.weights.shardcast.manifest import Manifest, sign
from composer_prime.transports.weights.shardcast.store import MANIFEST, SIGNATURE, ServerThread, Store, version_name

SKIP = ("STABLE",)  # the filesystem marker is local bookkeeping, not part of the weights


def model_hash(step_dir: Path) -> str:
    return payload.file_blake3(step_dir / "config.json")


class Origin:
    def __init__(self, root: Path, key: Ed25519PrivateKey, host: str = "127.0.0.1", port: int = 8100,
                 shard_size: int = 50_000_000, keep_last: int = 3) -> None:
        self.store = Store(root)
        self.key, self.shard_size, self.keep_last = key, shard_size, max(1, keep_last)
        self.server = ServerThread(self.store, host, port, "shardcast-origin")
        self.url = f"http://{host}:{port}"

    def start(self) -> "Origin":
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def publish(self, step: int, step_dir: Path) -> Manifest:
        """Cut `step_dir` into shards under vN/, sign its manifest, then list it (last)."""
        root = self.store.root
        final = root / version_name(step)
        staging = root / f".staging-{step}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        tar = staging / "payload.tar"
        payload.write_tar(step_dir, tar, skip=SKIP)
        shards = payload.cut(tar, staging, self.shard_size)
        manifest = Manifest(step=step, model_hash=model_hash(step_dir), total_size=tar.stat().st_size,
                            total_blake3=payload.file_blake3(tar), shards=tuple(shards))
        tar.unlink()
        (staging / MANIFEST).write_bytes(manifest.to_bytes())
        (staging / SIGNATURE).write_bytes(sign(manifest, self.key))
        shutil.rmtree(final, ignore_errors=True)  # a republished step (after a trainer resume) replaces the old one
        os.replace(staging, final)
        entries = self.store.distribution()
        entries[step] = (manifest.total_blake3, len(shards))
        keep = set(sorted(entries)[-self.keep_last:])
        self.store.write_distribution({s: v for s, v in entries.items() if s in keep})
        self.store.retain(keep)
        self.store.changed()
        return manifest

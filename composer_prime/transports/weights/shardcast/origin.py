"""The origin: inside the trainer, publishes each step in the SHARDCAST layout, signed, and serves it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from composer_prime.transports.weights.shardcast import payload
from composer_prime.transports.weights.shardcast.manifest import Delta, Manifest, sign
from composer_prime.transports.weights.shardcast.store import MANIFEST, SIGNATURE, ServerThread, Store, version_name
from composer_prime.utils.safetensors_index import tensor_index

SKIP = ("STABLE",)  # the filesystem marker is local bookkeeping, not part of the weights


def model_hash(step_dir: Path) -> str:
    return payload.file_blake3(step_dir / "config.json")


class Origin:
    def __init__(self, root: Path, key: Ed25519PrivateKey, host: str = "127.0.0.1", port: int = 8100,
                 shard_size: int = 50_000_000, keep_last: int = 3, delta: bool = True) -> None:
        self.store = Store(root)
        self.key, self.shard_size, self.keep_last, self.delta = key, shard_size, max(1, keep_last), delta
        self.server = ServerThread(self.store, host, port, "shardcast-origin")
        self.url = f"http://{host}:{port}"

    def start(self) -> "Origin":
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def publish(self, step: int, step_dir: Path) -> Manifest:
        """Cut `step_dir` into shards under vN/ (plus a delta from the previous step when that is
        smaller), sign its manifest, then list it: a listed step is always complete."""
        root = self.store.root
        staging = root / f".staging-{step}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        sink = payload.ShardSink(staging, self.shard_size)
        payload.write_payload(step_dir, sink, skip=SKIP)
        sink.close()
        shards = tuple(sink.shards)
        delta = self._delta(step, staging, shards, sink.size, weight_stride(step_dir)) if self.delta else None
        manifest = Manifest(step=step, model_hash=model_hash(step_dir), total_size=sink.size,
                            total_blake3=sink.total.hexdigest(), shards=shards, delta=delta)
        (staging / MANIFEST).write_bytes(manifest.to_bytes())
        (staging / SIGNATURE).write_bytes(sign(manifest, self.key))
        final = root / version_name(step)
        shutil.rmtree(final, ignore_errors=True)  # a republished step (after a trainer resume) replaces the old one
        os.replace(staging, final)
        entries = self.store.distribution()
        entries[step] = (manifest.total_blake3, len(shards))
        keep = set(sorted(entries)[-self.keep_last:])
        self.store.write_distribution({s: v for s, v in entries.items() if s in keep})
        self.store.retain(keep)
        self.store.changed()
        return manifest

    def _delta(self, step: int, staging: Path, shards: tuple, size: int, stride: int) -> Delta | None:
        """XOR-delta against the newest listed earlier step, kept only if smaller than the full step."""
        base = max((s for s in self.store.distribution() if s < step), default=None)
        if base is None:
            return None
        old = Manifest.from_bytes((self.store.root / version_name(base) / MANIFEST).read_bytes())
        if old.total_size != size or size % stride:
            return None  # a different layout (e.g. another dtype): full step only
        name = f"delta_from_{base:05d}.bin"
        old_dir = self.store.root / version_name(base)
        with (staging / name).open("wb") as f:
            payload.encode_delta(payload.file_chunks(old_dir / s.name for s in old.shards),
                                 payload.file_chunks(staging / s.name for s in shards), f, stride)
        delta_size = (staging / name).stat().st_size
        if delta_size >= size:
            (staging / name).unlink()
            return None
        return Delta(base, name, delta_size, payload.file_blake3(staging / name), stride)


def weight_stride(step_dir: Path) -> int:
    """Bytes per element of the step's largest tensor (the delta's plane width)."""
    sizes = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8}
    tensors = tensor_index(step_dir).values()
    largest = max(tensors, key=lambda t: t["data_offsets"][1] - t["data_offsets"][0], default=None)
    return sizes.get(largest["dtype"], 1) if largest else 4

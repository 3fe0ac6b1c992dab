"""A step directory as one SHARDCAST payload: an uncompressed, deterministic tar, cut in shards.

SHARDCAST distributes one file per version. A step directory (safetensors + config + tokenizer)
becomes a tar whose bytes depend only on the files' names and contents (sorted names, zeroed
owners and times), so two origins publishing the same step produce the same hashes.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

from blake3 import blake3

from composer_prime.transports.weights.shardcast.manifest import Manifest, Shard, VerificationError

SHARD_NAME = "shard_{:05d}.bin"  # SHARDCAST's name: 1-based, 5 digits
READ_CHUNK = 8 << 20


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    info.mode = 0o644
    return info


def write_tar(step_dir: Path, out: Path, skip: tuple[str, ...] = ()) -> None:
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(step_dir)):
            path = step_dir / name
            if path.is_file() and name not in skip:
                tar.add(path, arcname=name, recursive=False, filter=_normalized)


def cut(payload: Path, out_dir: Path, shard_size: int) -> list[Shard]:
    """Write `payload` as shard_00001.bin... into `out_dir`; return their names, sizes and hashes."""
    shards = []
    with payload.open("rb") as f:
        for i in range(1, 1 << 30):
            data = f.read(shard_size)
            if not data:
                break
            name = SHARD_NAME.format(i)
            (out_dir / name).write_bytes(data)
            shards.append(Shard(name, len(data), blake3(data).hexdigest()))
    return shards


def file_blake3(path: Path) -> str:
    h = blake3()
    with path.open("rb") as f:
        while chunk := f.read(READ_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def join(manifest: Manifest, shard_dir: Path, out: Path) -> None:
    """Concatenate verified shards into `out` and check the whole-payload hash."""
    h = blake3()
    with out.open("wb") as f:
        for s in manifest.shards:
            for chunk in _chunks(shard_dir / s.name):
                h.update(chunk)
                f.write(chunk)
    if h.hexdigest() != manifest.total_blake3:
        raise VerificationError(f"assembled payload of step {manifest.step} has the wrong hash")


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(READ_CHUNK):
            yield chunk


def extract(payload: Path, dest: Path) -> None:
    """Unpack a payload tar into `dest`: regular files at the top level only (no paths, no links)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(payload, "r:") as tar:
        for member in tar.getmembers():
            if not member.isfile() or "/" in member.name or member.name in ("", ".", ".."):
                raise VerificationError(f"payload member {member.name!r} is not a plain top-level file")
            src = tar.extractfile(member)
            with (dest / member.name).open("wb") as f:
                while chunk := src.read(READ_CHUNK):
                    f.write(chunk)


def bytes_blake3(data: bytes) -> str:
    return blake3(data).hexdigest()


__all__ = ["SHARD_NAME", "write_tar", "cut", "file_blake3", "join", "extract", "bytes_blake3"]

"""A step directory as one SHARDCAST payload: an uncompressed, deterministic tar, cut in shards.

SHARDCAST distributes one file per version. A step directory (safetensors + config + tokenizer)
becomes a tar whose bytes depend only on the files' names and contents (sorted names, zeroed
owners and times), so two origins publishing the same step produce the same hashes. The tar is
streamed straight into shard files and hashed on the way (one write), and read back the same
way: a chain of verified shards is unpacked without first being joined into one file.

A **delta** encodes step N against step M as zlib frames of XOR(payload_M, payload_N) with the
bytes of each `stride`-byte element split into planes: consecutive steps share the sign,
exponent and high mantissa bits of most weights, so the high planes are nearly all zero.
"""

from __future__ import annotations

import io
import os
import struct
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from blake3 import blake3

from composer_prime.transports.weights.shardcast.manifest import Shard, VerificationError

SHARD_NAME = "shard_{:05d}.bin"  # SHARDCAST's name: 1-based, 5 digits
CHUNK = 8 << 20


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    info.mode = 0o644
    return info


class ShardSink(io.RawIOBase):
    """A write-only stream that cuts what it receives into shard files and hashes as it goes."""

    def __init__(self, out_dir: Path, shard_size: int) -> None:
        self.out_dir, self.shard_size = out_dir, shard_size
        self.shards: list[Shard] = []
        self.total, self.size = blake3(), 0
        self._file, self._hash, self._fill = None, None, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.total.update(view)
        self.size += len(view)
        while len(view):
            if self._file is None:
                self._file = (self.out_dir / SHARD_NAME.format(len(self.shards) + 1)).open("wb")
                self._hash, self._fill = blake3(), 0
            take = view[: self.shard_size - self._fill]
            self._file.write(take)
            self._hash.update(take)
            self._fill += len(take)
            view = view[len(take):]
            if self._fill == self.shard_size:
                self._seal()
        return len(data)

    def _seal(self) -> None:
        name = Path(self._file.name).name
        self._file.close()
        self.shards.append(Shard(name, self._fill, self._hash.hexdigest()))
        self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._seal()
        super().close()


def write_payload(step_dir: Path, sink, skip: tuple[str, ...] = ()) -> None:
    """Stream `step_dir`'s files (top level, sorted) as a deterministic tar into `sink`."""
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(step_dir)):
            path = step_dir / name
            if path.is_file() and name not in skip:
                tar.add(path, arcname=name, recursive=False, filter=_normalized)


def file_chunks(paths: Iterable[Path]) -> Iterator[bytes]:
    for path in paths:
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk


def file_blake3(path: Path) -> str:
    h = blake3()
    for chunk in file_chunks([path]):
        h.update(chunk)
    return h.hexdigest()


class ChunkReader(io.RawIOBase):
    """A readable stream over an iterator of byte chunks, optionally hashing what it hands out."""

    def __init__(self, chunks: Iterator[bytes], hashing: bool = True) -> None:
        self._chunks, self._buf = chunks, b""
        self.hash, self.size = (blake3() if hashing else None), 0

    def readable(self) -> bool:
        return True

    def readinto(self, out) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(out), len(self._buf))
        out[:n] = self._buf[:n]
        if self.hash is not None:
            self.hash.update(self._buf[:n])
        self.size += n
        self._buf = self._buf[n:]
        return n


def extract(chunks: Iterator[bytes], dest: Path, total_blake3: str | None, total_size: int) -> None:
    """Unpack a payload stream into `dest` (plain top-level files only) and check its size and, if
    given, its whole hash (None when every shard was already checked against the signed manifest).

    The caller renames `dest` into place only after this returns, so a stream that fails the
    final check never becomes a step directory."""
    dest.mkdir(parents=True, exist_ok=True)
    reader = ChunkReader(chunks, hashing=total_blake3 is not None)
    with tarfile.open(fileobj=io.BufferedReader(reader, CHUNK), mode="r|") as tar:
        for member in tar:
            if not member.isfile() or "/" in member.name or member.name in ("", ".", ".."):
                raise VerificationError(f"payload member {member.name!r} is not a plain top-level file")
            src = tar.extractfile(member)
            with (dest / member.name).open("wb") as f:
                while chunk := src.read(CHUNK):
                    f.write(chunk)
    while reader.read(CHUNK):  # the tar's end padding counts towards the hash too
        pass
    if reader.size != total_size or (total_blake3 is not None and reader.hash.hexdigest() != total_blake3):
        raise VerificationError("payload does not match its manifest's total size and hash")


# ---------------------------------------------------------------- delta
def _planes(data: bytes, stride: int) -> bytes:
    return np.frombuffer(data, np.uint8).reshape(-1, stride).T.tobytes()


def _unplanes(data: bytes, stride: int) -> bytes:
    return np.frombuffer(data, np.uint8).reshape(stride, -1).T.tobytes()


def _aligned(chunks: Iterator[bytes], size: int) -> Iterator[bytes]:
    """Re-cut a chunk stream into pieces of exactly `size` bytes (the last may be shorter)."""
    buf = b""
    for chunk in chunks:
        buf += chunk
        while len(buf) >= size:
            yield buf[:size]
            buf = buf[size:]
    if buf:
        yield buf


def encode_delta(old: Iterator[bytes], new: Iterator[bytes], sink, stride: int) -> None:
    """Write frames [u32 length][zlib(planes(old XOR new))] of CHUNK bytes each into `sink`."""
    for a, b in zip(_aligned(old, CHUNK), _aligned(new, CHUNK), strict=True):
        if len(a) != len(b) or len(a) % stride:
            raise ValueError("delta needs payloads of equal, stride-aligned length")
        x = np.bitwise_xor(np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8)).tobytes()
        frame = zlib.compress(_planes(x, stride), 1)
        sink.write(struct.pack("<I", len(frame)))
        sink.write(frame)


def decode_delta(old: Iterator[bytes], delta: Path, stride: int) -> Iterator[bytes]:
    """The new payload's chunks from the old payload's chunks and a delta file."""
    with delta.open("rb") as f:
        for a in _aligned(old, CHUNK):
            head = f.read(4)
            if len(head) != 4:
                raise VerificationError("delta is shorter than the base payload")
            x = _unplanes(zlib.decompress(f.read(struct.unpack("<I", head)[0])), stride)
            if len(x) != len(a):
                raise VerificationError("delta frame does not match the base payload")
            yield np.bitwise_xor(np.frombuffer(a, np.uint8), np.frombuffer(x, np.uint8)).tobytes()
        if f.read(1):
            raise VerificationError("delta is longer than the base payload")

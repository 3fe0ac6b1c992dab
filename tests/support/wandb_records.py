"""Read back what W&B wrote to an offline run: the rows of its `.wandb` transaction log.

The file is W&B's 7-byte header followed by a LevelDB-style log (32 KiB blocks; each chunk a
7-byte header: crc32c, length, kind) of protobuf `Record`s, parsed with wandb's own classes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _chunks(data: bytes) -> Iterator[bytes]:
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + HEADER:pos + HEADER + length], pos + HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk


def runs(root: Path) -> list[Path]:
    """Offline run directories under `root` (W&B's `dir`), oldest first."""
    return sorted((root / "wandb").glob("offline-run-*"))


def history(run_dir: Path) -> list[dict]:
    """Every logged row of one run, in order, with W&B's own keys (_step, _runtime, ...) dropped."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for chunk in _chunks(next(run_dir.glob("*.wandb")).read_bytes()):
        record = pb.Record()
        record.ParseFromString(chunk)
        if record.WhichOneof("record_type") == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            rows.append({k: v for k, v in row.items() if not k.startswith("_")})
    return rows

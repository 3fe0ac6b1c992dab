"""Read the tensor index of a model directory's safetensors files without loading any weights."""

from __future__ import annotations

import json
from pathlib import Path


def tensor_index(model_dir: Path) -> dict[str, dict]:
    """Name -> {"dtype", "shape", "data_offsets"} for every tensor in `model_dir/*.safetensors`."""
    index: dict[str, dict] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with f.open("rb") as fh:  # layout: u64 little-endian header length, then a JSON header
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        header.pop("__metadata__", None)
        index.update(header)
    return index

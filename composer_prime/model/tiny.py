"""The tiny default model: a Qwen3-shaped ~1M-parameter LM, built offline and warm-started.

`ensure_tiny_model()` returns a directory with config.json, model.safetensors and the
tokenizer. It is cached by a content hash of everything that determines the weights (the
architecture, tokenizer, SFT recipe and seed), so the first call pays about a CPU-minute
of SFT on the quickstart task and every later call reuses the files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

from composer_prime.utils.fs import built_once

if TYPE_CHECKING:  # the builder imports torch and transformers itself: finding the cached model needs neither (3 s)
    import torch
    from transformers import PreTrainedTokenizerBase, Qwen3ForCausalLM

log = logging.getLogger(__name__)

ARCH = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,  # vLLM's CPU attention rejects head_dim 16
    max_position_embeddings=2048,  # tool environments (feature-deletion) have long prompts
    tie_word_embeddings=True,
    rope_theta=10000.0,
)
# AdamW with linear warm-up and linear decay to a tenth (model/optim.py); weight decay and betas are torch's defaults
SFT = dict(steps=140, warmup=30, batch_size=64, lr=1e-3, weight_decay=0.01, betas=[0.9, 0.999], min_lr_ratio=0.1,
           seed=0, min_len=3, max_len=6, alphabet="abcdefgh")
RECIPE_VERSION = 2  # bump when the builder changes in a way that changes the weights


def cache_root() -> Path:
    return Path(os.environ.get("COMPOSER_PRIME_CACHE", Path.home() / ".cache" / "composer-prime"))


def recipe_hash() -> str:
    blob = json.dumps({"arch": ARCH, "sft": SFT, "v": RECIPE_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_random(tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> Qwen3ForCausalLM:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **ARCH,
    )
    return Qwen3ForCausalLM(config).float()


def _sft_batch(tok: PreTrainedTokenizerBase, rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
    from composer_prime.model.warm_start import encode_example, pad_batch

    rows = []
    for _ in range(SFT["batch_size"]):
        seq = [rng.choice(SFT["alphabet"]) for _ in range(rng.randint(SFT["min_len"], SFT["max_len"]))]
        rows.append(encode_example(tok, [{"role": "system", "content": "Reverse the letters."},
                                         {"role": "user", "content": " ".join(seq)},
                                         {"role": "assistant", "content": " ".join(reversed(seq))}]))
    return pad_batch(rows, tok.pad_token_id)


def warm_start(model: Qwen3ForCausalLM, tok: PreTrainedTokenizerBase) -> None:
    """Answer-only cross-entropy (the trainer's `ce` channel) on the reverse-text task; stops short of mastery."""
    from composer_prime.config.models import OptimConfig
    from composer_prime.model.optim import build_optimizer, set_lr
    from composer_prime.model.warm_start import sft_step

    rng = random.Random(SFT["seed"])
    cfg = OptimConfig(lr=SFT["lr"], warmup_steps=SFT["warmup"], weight_decay=SFT["weight_decay"], betas=SFT["betas"],
                      decay="linear", min_lr_ratio=SFT["min_lr_ratio"])
    opt = build_optimizer(model.parameters(), cfg)
    start = time.time()
    for step in range(SFT["steps"]):
        set_lr(opt, cfg, step, SFT["steps"])
        loss = sft_step(model, opt, *_sft_batch(tok, rng))
        if step % 50 == 0 or step == SFT["steps"] - 1:
            log.info(f"tiny model: sft step {step + 1}/{SFT['steps']} loss {loss:.3f} ({time.time() - start:.0f}s)")


def ensure_tiny_model() -> Path:
    """Build (once, whichever process asks first) and return the cached tiny model directory."""
    return built_once(cache_root() / "models" / f"tiny-{recipe_hash()}", _build)


def _build(tmp: Path) -> None:
    log.info(f"tiny model: building {tmp.name} (one-time, about a CPU-minute)")
    import torch

    from composer_prime.model.tokenizer import build_tokenizer

    torch.set_num_threads(1)
    tok = build_tokenizer()
    model = build_random(tok)
    warm_start(model, tok)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "READY").write_text(recipe_hash())

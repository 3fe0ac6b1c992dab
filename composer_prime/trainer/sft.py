"""Supervised fine-tuning by answer-only cross-entropy (`uv run sft`, entrypoints/sft.py).

Data: a JSONL file of `{"messages": [{"role": ..., "content": ...}, ...]}`; the loss is on the
last assistant message only (the prompt is context). One process, no FSDP: SFT here is the
warm start of small models (the step is model/warm_start.py's, which the tiny default's build
uses too); the RL trainer is the big-model path. Writes a Hugging Face model directory
(safetensors + tokenizer) to `output_dir`.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from composer_prime.config import ConfigError, SFTConfig
from composer_prime.model.resolve import resolve_model
from composer_prime.model.warm_start import encode_example, pad_batch, sft_step

log = logging.getLogger(__name__)


def read_jsonl(path: Path, tok: PreTrainedTokenizerBase) -> list[tuple[list[int], list[int]]]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(encode_example(tok, json.loads(line)["messages"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"data: {path}:{n}: not a chat example ({e})") from None
    if not rows:
        raise ConfigError(f"data: {path}: no examples")
    return rows


def train(cfg: SFTConfig) -> None:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)
    path = resolve_model(cfg.model)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    data = read_jsonl(cfg.data, tok)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)))
    rng, start = random.Random(cfg.seed), time.time()
    for step in range(cfg.max_steps):
        ids, mask = pad_batch([rng.choice(data) for _ in range(cfg.batch_size)], tok.pad_token_id or 0)
        loss = sft_step(model, optim, ids, mask)
        sched.step()
        if step % 10 == 0 or step == cfg.max_steps - 1:
            log.info(f"step {step + 1}/{cfg.max_steps} loss {loss:.4f} ({time.time() - start:.0f}s)")
    cfg.output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(cfg.output_dir)
    tok.save_pretrained(cfg.output_dir)
    log.info(f"wrote {cfg.output_dir}")

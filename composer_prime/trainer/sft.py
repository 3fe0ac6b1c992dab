"""Supervised fine-tuning (`uv run sft`, entrypoints/sft.py): answer-only cross-entropy, or DPO.

`--objective ce` (the default): a JSONL file of `{"messages": [{"role": ..., "content": ...}, ...]}`;
the loss is on the last assistant message only (the prompt is context). `--objective dpo`: a
dataset from `composer-prime traces dataset` (pairs with the frozen reference's log-probs); the
loss is the `dpo` channel's (trainer/loss/dpo.py), on sequences rendered by the function the
reference log-probs were computed with, so "policy = reference" gives exactly ln 2 at step 0. One process, no FSDP: SFT here is the
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
from composer_prime.traces.dataset import pair_logps
from composer_prime.trainer.loss.dpo import dpo_loss

log = logging.getLogger(__name__)


def read_jsonl(path: Path, tok: PreTrainedTokenizerBase) -> list[tuple[list[int], list[int]]]:
    if path.is_dir():
        raise ConfigError(f"data: {path} is a pairs dataset; train on it with --objective dpo")
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


def read_pairs(path: Path) -> list[dict]:
    from datasets import load_from_disk

    try:
        rows = load_from_disk(str(path)).to_list()
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"data: {path}: not a dataset from `composer-prime traces dataset` ({e})") from None
    if not rows or "ref_chosen_logps" not in rows[0]:
        raise ConfigError(f"data: {path}: no pairs with reference log-probs (ref_chosen_logps)")
    return rows


def dpo_step(model: torch.nn.Module, optim: torch.optim.Optimizer, tok: PreTrainedTokenizerBase, rows: list[dict],
             beta: float) -> float:
    """One optimizer step of mean DPO loss over `rows` (each side one forward: batches of one pair's length)."""
    optim.zero_grad(set_to_none=True)
    losses = []
    for r in rows:
        seq = pair_logps(model, tok, r)
        losses.append(dpo_loss(seq["chosen"], seq["rejected"], torch.tensor(r["ref_chosen_logps"]),
                               torch.tensor(r["ref_rejected_logps"]), beta))
    loss = torch.stack(losses).mean()
    loss.backward()
    optim.step()
    return float(loss)


def train(cfg: SFTConfig) -> None:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)
    path = resolve_model(cfg.model)
    tok = AutoTokenizer.from_pretrained(path)
    data = read_jsonl(cfg.data, tok) if cfg.objective == "ce" else read_pairs(cfg.data)  # bad data: before the model loads
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)))
    rng, start = random.Random(cfg.seed), time.time()
    for step in range(cfg.max_steps):
        picked = [rng.choice(data) for _ in range(cfg.batch_size)]
        if cfg.objective == "ce":
            loss = sft_step(model, optim, *pad_batch(picked, tok.pad_token_id or 0))
        else:
            loss = dpo_step(model, optim, tok, picked, cfg.beta)
        sched.step()
        if step % 10 == 0 or step == cfg.max_steps - 1:
            log.info(f"step {step + 1}/{cfg.max_steps} loss {loss:.4f} ({time.time() - start:.0f}s)")
    cfg.output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(cfg.output_dir)
    tok.save_pretrained(cfg.output_dir)
    log.info(f"wrote {cfg.output_dir}")

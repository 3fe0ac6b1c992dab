"""Supervised fine-tuning (`uv run sft`, entrypoints/sft.py): the trainer on a local dataset.

`--objective ce` (the default): a JSONL file of `{"messages": [{"role": ..., "content": ...}, ...]}`,
trained by the `ce` channel with weight on the last assistant message's tokens only (the prompt is
context). `--objective dpo`: a dataset from `composer-prime traces dataset`, trained by the `dpo`
channel on the rows `traces.dpo_rows.pair_samples` makes (rendered by the function the reference
log-probs were computed with, so "policy = reference" gives exactly ln 2 at step 0).

The run is the trainer's (trainer/train.py): this process joins a process group of one, and the
same FSDP2 step, optimizer and schedule train on the device the trainer uses, in its compute dtype
with float32 master weights; only the source of batches differs (`DatasetSource`). AdamW keeps
what `sft` has always used: weight decay 0.01, betas (0.9, 0.999), no gradient clipping. Metrics
go beside the model, not into it: `<output_dir>.sft/metrics.jsonl` (`metrics_path`); the model
directory (safetensors + tokenizer, float32) is written to `output_dir` at the end, holding nothing
but the model, so it can be copied or published as it is.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from composer_prime.config import ConfigError, SFTConfig, TrainerConfig
from composer_prime.config.models import OptimConfig
from composer_prime.contract.batches import Sample
from composer_prime.model.resolve import resolve_model
from composer_prime.model.warm_start import encode_example
from composer_prime.traces.dpo_rows import pair_samples
from composer_prime.trainer.model import full_state_dict
from composer_prime.trainer.sources import DatasetSource
from composer_prime.trainer.train import build, fit, join
from composer_prime.utils.chat import TemplateError
from composer_prime.utils.metrics import MetricsLog

log = logging.getLogger(__name__)


def metrics_path(output_dir: Path) -> Path:
    """Where `sft` writes its metrics for the model it saves in `output_dir`: beside it."""
    return Path(output_dir).parent / f"{Path(output_dir).name}.sft" / "metrics.jsonl"

def read_jsonl(path: Path, tok: PreTrainedTokenizerBase) -> list[Sample]:
    """One `ce` sample per example: weight 1 on the answer's tokens."""
    if path.is_dir():
        raise ConfigError(f"data: {path} is a pairs dataset; train on it with --objective dpo")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            ids, answer = encode_example(tok, json.loads(line)["messages"])
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"data: {path}:{n}: not a chat example ({e})") from None
        rows.append(Sample(ids, [0.0] * len(ids), [0.0] * len(ids), {"ce": [float(a) for a in answer]}))
    if not rows:
        raise ConfigError(f"data: {path}: no examples")
    return rows


def read_pairs(path: Path, tok: PreTrainedTokenizerBase) -> list[dict]:
    """The pairs, each rendered once here so that one the template cannot render fails before training."""
    from datasets import load_from_disk

    try:
        rows = load_from_disk(str(path)).to_list()
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"data: {path}: not a dataset from `composer-prime traces dataset` ({e})") from None
    if not rows or "ref_chosen_logps" not in rows[0]:
        raise ConfigError(f"data: {path}: no pairs with reference log-probs (ref_chosen_logps)")
    for n, row in enumerate(rows):
        try:
            pair_samples(tok, row, str(n))
        except (TemplateError, ValueError, KeyError, IndexError, TypeError) as e:
            raise ConfigError(f"data: {path}: pair {n}: cannot be rendered ({e})") from None
    return rows


def trainer_config(cfg: SFTConfig, model_dir: str) -> TrainerConfig:
    """The trainer's config for this run: one channel, sft's optimizer settings."""
    loss = {"weights": {cfg.objective: 1.0}} | ({"dpo": {"beta": cfg.beta}} if cfg.objective == "dpo" else {})
    optim = OptimConfig(lr=cfg.lr, warmup_steps=cfg.warmup_steps, weight_decay=0.01, betas=(0.9, 0.999),
                        max_norm=math.inf)
    return TrainerConfig(model=model_dir, max_steps=cfg.max_steps, output_dir=cfg.output_dir, seed=cfg.seed,
                         optim=optim, loss=loss, compute_dtype=cfg.compute_dtype,
                         micro_batch_tokens=cfg.micro_batch_tokens)


def train(cfg: SFTConfig) -> None:
    model_dir = resolve_model(cfg.model)
    tok = AutoTokenizer.from_pretrained(model_dir)
    if cfg.objective == "ce":  # bad data: found here, before the model loads and anything is written
        samples = read_jsonl(cfg.data, tok)
        source = DatasetSource(len(samples), lambda i, key: [samples[i]], cfg.batch_size, cfg.seed)
    else:
        pairs = read_pairs(cfg.data, tok)
        source = DatasetSource(len(pairs), lambda i, key: pair_samples(tok, pairs[i], key), cfg.batch_size, cfg.seed)
    tcfg = trainer_config(cfg, model_dir)
    join(tcfg)
    t = build(tcfg)
    out_dir = Path(cfg.output_dir)
    sink = MetricsLog(out_dir.parent, f"{out_dir.name}.sft") if dist.get_rank() == 0 else None  # metrics_path()
    start = time.time()

    def after(step: int, metrics: dict[str, float]) -> None:
        if sink is not None:
            sink.log({"step": step, "time": time.time(), **metrics})
        if step % 10 == 0 or step == cfg.max_steps - 1:
            log.info(f"step {step + 1}/{cfg.max_steps} loss {metrics.get(f'loss/{cfg.objective}', 0.0):.4f} "
                     f"({time.time() - start:.0f}s)")

    fit(t, source, 0, after)
    state = full_state_dict(t.model)  # collective
    if dist.get_rank() == 0:
        # a plain model of the architecture's own class (not FSDP's) writes the config and weights
        out = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        out.load_state_dict(state)
        out.save_pretrained(cfg.output_dir)
        tok.save_pretrained(cfg.output_dir)
        sink.close()
        log.info(f"wrote {cfg.output_dir}")
    dist.destroy_process_group()

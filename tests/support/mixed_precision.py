"""One trainer step on a fresh random tiny model, in a process group of this one process (the
trainer's own `join`: an in-memory store, no socket on gloo), and what it did to the weights.

A fresh model's RMSNorm weights are exactly 1.0. With AdamW's first step (lr 1e-4, no weight
decay) every weight whose gradient is well above Adam's eps moves by lr = 1e-4: far below
bfloat16's resolution at 1.0 (2^-7), so it shows whether the update reached float32 weights.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from composer_prime.config.models import TrainerConfig
from composer_prime.contract.batches import Batch, Sample
from composer_prime.model.tiny import build_random
from composer_prime.model.tokenizer import build_tokenizer
from composer_prime.trainer.train import build, join, train_step

LR = 1e-4


@dataclass
class Step:
    forward_dtypes: set[torch.dtype]  # what a decoder block computed in
    devices: set[str]  # where the weights live
    norms: list[tuple[torch.Tensor, torch.Tensor]]  # every RMSNorm weight after the step, with its gradient
    master_dtypes: set[torch.dtype]  # every parameter's
    state_dtypes: set[torch.dtype]  # every AdamW moment's


def fresh_model(out: Path) -> Path:
    tok = build_tokenizer()
    build_random(tok, seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def ce_batch() -> Batch:
    rng = random.Random(0)
    samples = []
    for _ in range(8):
        ids = [rng.randrange(3, 500) for _ in range(24)]
        samples.append(Sample(ids, [0.0] * 24, [0.0] * 24, {"ce": [0.0] * 12 + [1.0] * 12}))
    return Batch(0, samples)


def one_step(model_dir: Path, compute_dtype: str) -> Step:
    cfg = TrainerConfig(model=str(model_dir), compute_dtype=compute_dtype, loss={"weights": {"ce": 1.0}},
                        optim={"lr": LR, "warmup_steps": 0, "weight_decay": 0.0})
    threads = torch.get_num_threads()
    join(cfg)
    try:
        t = build(cfg)
        seen: set[torch.dtype] = set()
        t.model.model.layers[0].mlp.register_forward_hook(lambda mod, inp, out: seen.add(out.dtype))
        train_step(cfg, t.model, t.optim, ce_batch(), t.objective, t.pad_id)
        params = dict(t.model.named_parameters())
        norms = [(p.to_local().detach().cpu(), p.grad.to_local().cpu()) for n, p in params.items() if "norm" in n]
        return Step(seen, {p.device.type for p in params.values()}, norms, {p.dtype for p in params.values()},
                    {v.dtype for s in t.optim.state.values() for k, v in s.items() if k.startswith("exp_avg")})
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)  # join pins one thread; the test process goes on with its own


def moved_by_lr(step: Step) -> tuple[int, int]:
    """(weights with a clear gradient, those of them that read 1 +- lr within float32's error)."""
    clear = moved = 0
    for w, g in step.norms:
        big = g.abs() > 1e-4  # Adam's first step is lr * g / (|g| + 1e-8): within 1e-8 of lr here
        clear += int(big.sum())
        moved += int((((w[big] - 1).abs() - LR).abs() <= 2e-7).sum())
    return clear, moved

"""The optimizer and the learning-rate schedule, built from an `OptimConfig`: the one definition
that `train` (the RL trainer), `sft` and the tiny model's warm start all use.

The learning rate at step s is a pure function of the config, s and the run's length:

    lr(s) = lr * min(1, (s + 1) / warmup_steps) * decay(s)
    decay(s) = 1 (constant)   or   max(min_lr_ratio, 1 - s / max_steps) (linear)

It is set on the optimizer before every step rather than kept in a scheduler's state, so a
resumed run gets the same lr at the same step. It sits at the model level, below the trainer,
because building the tiny model runs it and building a model never imports the trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import torch

if TYPE_CHECKING:
    from composer_prime.config.models import OptimConfig


def lr_at(cfg: OptimConfig, step: int, max_steps: int) -> float:
    """The learning rate of step `step` (0-based) in a run of `max_steps` steps."""
    warm = min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    decay = max(cfg.min_lr_ratio, 1 - step / max_steps) if cfg.decay == "linear" else 1.0
    # lr * (warm * decay), in this order, is torch's LambdaLR's arithmetic: the tiny model's weights depend on it
    return cfg.lr * (warm * decay)


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW with the config's weight decay and betas; its lr is set per step by `set_lr`."""
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas))


def set_lr(optim: torch.optim.Optimizer, cfg: OptimConfig, step: int, max_steps: int) -> float:
    """Set every group's lr for `step`; returns it."""
    lr = lr_at(cfg, step, max_steps)
    for g in optim.param_groups:
        g["lr"] = lr
    return lr

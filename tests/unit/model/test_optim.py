"""The learning-rate schedule (model/optim.py) is a pure function of (config, step, run length) and
gives, float for float, the three schedules it replaced: the trainer's inline warm-up, sft's
LambdaLR warm-up and the tiny model's warm start (whose cached weights depend on every bit)."""

import pytest
import torch

from composer_prime.config.models import OptimConfig
from composer_prime.model.optim import build_optimizer, lr_at, set_lr
from composer_prime.model.tiny import SFT


def lambda_lr(lr: float, steps: int, factor) -> list[float]:
    """What torch's LambdaLR set at each step (the old sft and tiny warm-start schedules)."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()  # no gradient: nothing moves; keeps LambdaLR's order-of-calls check quiet
        sched.step()
    return out


def test_the_tiny_warm_starts_schedule_float_for_float():
    steps, warmup = SFT["steps"], SFT["warmup"]
    cfg = OptimConfig(lr=SFT["lr"], warmup_steps=warmup, decay="linear", min_lr_ratio=SFT["min_lr_ratio"])
    old = lambda_lr(SFT["lr"], steps, lambda s: min(1.0, (s + 1) / warmup) * max(0.1, 1 - s / steps))
    assert [lr_at(cfg, s, steps) for s in range(steps)] == old


def test_sfts_and_the_trainers_warm_up_float_for_float():
    cfg = OptimConfig(lr=3e-4, warmup_steps=20)
    assert [lr_at(cfg, s, 100) for s in range(100)] == lambda_lr(3e-4, 100, lambda s: min(1.0, (s + 1) / 20))
    assert [lr_at(cfg, s, 100) for s in range(100)] == [3e-4 * min(1.0, (s + 1) / 20) for s in range(100)]


def test_linear_decay_floors_at_min_lr_ratio_and_no_warm_up_starts_at_lr():
    cfg = OptimConfig(lr=2.0, warmup_steps=0, decay="linear", min_lr_ratio=0.25)
    assert [lr_at(cfg, s, 100) for s in (0, 50, 70, 75, 99)] == pytest.approx([2.0, 1.0, 0.6, 0.5, 0.5], rel=1e-15)


def test_the_optimizer_and_its_lr_come_from_the_config():
    cfg = OptimConfig(lr=1e-3, warmup_steps=4, weight_decay=0.05, betas=(0.8, 0.95))
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg)
    (group,) = opt.param_groups
    assert (group["weight_decay"], group["betas"]) == (0.05, (0.8, 0.95))
    assert set_lr(opt, cfg, 1, 10) == group["lr"] == pytest.approx(5e-4, rel=1e-15)

"""The command line of the benchmarks that launch `rl` runs (real_model, distill_ab, replay_ab):
a bad argument as one line with exit code 2, `--device` and `--parallel`, what a device asks of each
run (its environment, its rl flags, and its share of one GPU), and the stamp of a result (machine,
date, commit: every benchmark's, `commit()`)."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[2]
# configs/smollm2-135m-gpu.toml's settings on CUDA: the embedded engine and the trainer's forward and
# backward in bfloat16 (the trainer publishes the weights in its compute dtype, the one inference serves)
CUDA_FLAGS = ["--inference.device", "cuda", "--inference.dtype", "bfloat16", "--trainer.compute_dtype", "bfloat16"]
VLLM_SHARE = 0.4  # of the GPU's memory for all the vLLM servers together; the rest is the trainers'


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (no usage block) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def add_run_args(p: argparse.ArgumentParser, device_default: str | None = "cpu") -> None:
    """--device (required when device_default is None) and --parallel."""
    p.add_argument("--device", choices=["cpu", "cuda"], default=device_default, required=device_default is None,
                   help="where every run's inference and trainer go (cuda: one GPU, shared by the concurrent runs)")
    p.add_argument("--parallel", type=int, default=1, help="runs (arms x seeds) at once, each with its own ports, "
                                                           "output directory and log")


def check_run_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.parallel < 1:
        p.error(f"--parallel must be at least 1, got {a.parallel}")
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: torch sees no CUDA device here")


def device_env(device: str) -> dict[str, str]:
    """Added to every run's environment. On the CPU no GPU is visible: the trainer and the embedded
    engine take CUDA whenever torch sees it (device auto), so a CPU run on a GPU machine would not be one."""
    return {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}


def device_flags(device: str) -> list[str]:
    """rl flags of a run on `device`; part of the command a finished run is reused by."""
    return CUDA_FLAGS if device == "cuda" else []


def share_flags(device: str, parallel: int, flags: list[str]) -> list[str]:
    """rl flags that let `parallel` runs share one GPU. vLLM takes a fixed fraction of the GPU's memory
    when it starts (its --gpu-memory-utilization, 0.9 by default: one server would leave nothing to
    the others), so each server gets VLLM_SHARE / parallel of it. The embedded engine sizes its KV
    cache by inference.max_batch and inference.max_model_len instead: nothing to share out. Left out
    on the CPU, and when `flags` set vLLM's arguments themselves. Not part of a run's recorded command
    (as its ports are not): the same run at another --parallel is the same run."""
    if device != "cuda" or "--inference.vllm_args" in flags:
        return []
    return ["--inference.vllm_args", f'["--gpu-memory-utilization={VLLM_SHARE / parallel:.3f}"]']


def machine(device: str, threads: int | None = None) -> str:
    """The GPU's name on CUDA; on the CPU its model, and the threads (if given) or the cores."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name()
    names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")]
    return f"{names[0] if names else platform.processor()} " + (f"({threads} thread)" if threads else f"({os.cpu_count()} cores)")


def git(*args: str) -> str:
    """What git prints in the checkout; "" where it fails, or where there is no git or no repository."""
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def commit() -> str:
    """The checkout's short commit; a copy of the tree without its repository (on a GPU machine, say) names it
    in $COMPOSER_PRIME_COMMIT, else it is "unknown"."""
    return git("rev-parse", "--short", "HEAD") or os.environ.get("COMPOSER_PRIME_COMMIT") or "unknown"


def stamp(device: str, threads: int | None = None) -> dict:
    """Machine, date and commit of a result."""
    return {"machine": machine(device, threads), "date": datetime.date.today().isoformat(), "commit": commit(),
            "device": device}

"""Where and in what precision the embedded engine runs: `inference.device`, `.dtype` and `.graphs` decided.

auto means: CUDA when torch sees a GPU, bfloat16 there and float32 on the CPU (where bfloat16
matmuls are slower and log-probs would drift from the trainer's float32 recomputation), and
the decode step replayed as CUDA graphs on CUDA (graphs.py), run op by op on the CPU (compiling it
there pays only for the tiny model, and costs seconds at every start: graphs.py). torch is
imported only when asked, so a config check stays fast.
"""

from __future__ import annotations


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def check_device(device: str) -> None:
    """The check of `inference.device` on this machine (entrypoints/checks.py)."""
    if device == "cuda" and not cuda_available():
        raise ValueError("cuda: torch sees no CUDA device on this machine (use auto or cpu)")


def resolve(device: str, dtype: str, graphs: str) -> tuple[str, str, str]:
    """(device, dtype, graphs) with every auto decided for this machine."""
    dev = ("cuda" if cuda_available() else "cpu") if device == "auto" else device
    if dev == "cpu" and graphs == "capture":
        raise ValueError("graphs = 'capture' needs CUDA (the device here is the CPU)")
    return (dev, ("bfloat16" if dev == "cuda" else "float32") if dtype == "auto" else dtype,
            ("capture" if dev == "cuda" else "off") if graphs == "auto" else graphs)

"""The trainer's `compute_dtype = "auto"` decided by where it runs (trainer/model.py): bfloat16 on CUDA,
float32 on the CPU, and a named dtype whatever the device. The step that computes in it is
test_mixed_precision.py's (CPU) and test_rl_gpu.py's (CUDA); this is the decision alone, which a CPU
can check for CUDA too."""

import pytest
import torch

from composer_prime.trainer import model


@pytest.mark.parametrize("device, name, want", [
    ("cuda", "auto", torch.bfloat16), ("cpu", "auto", torch.float32),
    ("cuda", "float32", torch.float32), ("cpu", "bfloat16", torch.bfloat16),
])
def test_auto_is_bfloat16_on_cuda_and_float32_on_the_cpu(monkeypatch, device, name, want):
    monkeypatch.setattr(model, "device_type", lambda: device)
    assert model.compute_dtype(name) == want

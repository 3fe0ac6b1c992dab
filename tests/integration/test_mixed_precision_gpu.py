"""Mixed precision on CUDA (the GPU machine): by default the trainer computes in bfloat16 on the
GPU, and a step's update of 1e-4 to a weight of 1.0 still lands on float32 master weights with
float32 optimizer state (tests/unit/trainer/test_mixed_precision.py is the same on the CPU). Here,
not in the unit tier: NCCL's one-rank group opens its own sockets."""

import pytest
import torch

from tests.support.mixed_precision import fresh_model, moved_by_lr, one_step


@pytest.mark.gpu
def test_default_on_cuda_computes_in_bf16_and_updates_float32_masters(tmp_path):
    step = one_step(fresh_model(tmp_path), "auto")
    assert step.devices == {"cuda"} and step.forward_dtypes == {torch.bfloat16}
    assert step.master_dtypes == step.state_dtypes == {torch.float32}
    clear, moved = moved_by_lr(step)
    assert clear > 500 and moved == clear, (clear, moved)

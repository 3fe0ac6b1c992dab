"""Mixed precision (trainer/model.py): whatever the compute dtype, a step's update is applied to
float32 master weights, with float32 optimizer state. A weight of 1.0 updated by 1e-4 reads
1 +- 1e-4: weights held in bfloat16 (the trainer's old load on CUDA) would read 1.0 exactly."""

import pytest
import torch

from composer_prime.config import RLConfig, TrainerConfig
from composer_prime.config.loader import ConfigError, parse_argv, validate
from composer_prime.trainer.train import published_dtype
from tests.support.mixed_precision import fresh_model, moved_by_lr, one_step


@pytest.mark.parametrize("compute_dtype", ["bfloat16", "float32"])
def test_a_step_updates_float32_master_weights(tmp_path, compute_dtype):
    step = one_step(fresh_model(tmp_path), compute_dtype)
    assert step.forward_dtypes == {getattr(torch, compute_dtype)}  # FSDP2's policy computes in it
    assert step.master_dtypes == step.state_dtypes == {torch.float32}
    clear, moved = moved_by_lr(step)
    assert clear > 500 and moved == clear, (clear, moved)


def test_auto_computes_in_float32_on_the_cpu_and_in_bfloat16_on_cuda(tmp_path):
    step = one_step(fresh_model(tmp_path), "auto")
    on_gpu = torch.cuda.is_available()  # the gpu test (integration) pins CUDA on its own
    assert step.devices == {"cuda" if on_gpu else "cpu"}
    assert step.forward_dtypes == {torch.bfloat16 if on_gpu else torch.float32}


def test_a_compute_dtype_that_is_not_offered_is_refused_when_the_config_loads():
    tree, provenance, _ = parse_argv(["--trainer.compute_dtype", "float16"])  # float16 would need loss scaling
    with pytest.raises(ConfigError) as e:
        validate(RLConfig, tree, provenance).split(provenance)
    assert str(e.value).startswith("trainer.compute_dtype") and "'auto', 'float32' or 'bfloat16'" in str(e.value)


def test_weights_are_published_in_the_compute_dtype_unless_told():
    assert published_dtype(TrainerConfig(compute_dtype="float32")) == torch.float32
    assert published_dtype(TrainerConfig(compute_dtype="bfloat16")) == torch.bfloat16  # what a GPU's inference serves
    assert published_dtype(TrainerConfig(compute_dtype="bfloat16", weight_broadcast={"dtype": "float32"})) == torch.float32

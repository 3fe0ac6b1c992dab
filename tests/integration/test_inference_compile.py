"""The embedded engine's decode step compiled by torch.compile (inference.graphs = "compile"), which
starts compiler processes: on the CPU, compiled and run as it is; on CUDA (gpu-marked), compiled
then recorded as CUDA graphs. Either gives the requests' tokens of the step run op by op, and
their log-probs to float noise. On the CPU the compiled step runs on the memory layouts CUDA's
kernels hand the attention (tests/unit/inference/test_cuda_layouts.py's stand-ins: Inductor's
lowering of them, which that unit tier cannot start).

And what compiling saves a step on a GPU, where a recorded step's time is about its kernel count
(benchmarks/README.md, real_model's bound): the kernels Inductor's code launches per decode step,
pinned beside the op-by-op count of tests/unit/inference/test_decode_ops.py (43 a layer there)."""

import pytest
import torch

from benchmarks.support.floors import compiled_launches
from tests.support.hf_batches import BUDGETS, load, run
from tests.unit.inference.test_cuda_layouts import use_cuda_layouts
from tests.unit.inference.test_decode_ops import admitted, smollm2_shape

# measured 2026-11-27 (torch 2.13 CPU, transformers of uv.lock): norms, rotary, the cache write and the
# sampler fused; left apart per layer: 7 matmuls, the attention and 6 fused kernels. SmolLM2's 30 layers:
# 7 + 14 x 30 = 427 launches, against 1,364 op by op.
COMPILED_BASE, COMPILED_PER_LAYER = 7, 14


def same_completions(got: dict, want: dict) -> None:
    assert len(got) == 9 and {len(t) for t, _ in got.values()} == BUDGETS
    assert all(got[i][0] == want[i][0] for i in want)
    assert all(got[i][1] == pytest.approx(want[i][1], abs=1e-4) for i in want)


def first_layers(model, n: int):
    """`model` cut to its first `n` decoder layers, its config too (the batch's KV cache is sized from it)."""
    model.model.layers = model.model.layers[:n]
    model.config.num_hidden_layers, model.config.layer_types = n, model.config.layer_types[:n]
    return model


def test_the_compiled_step_on_the_cpu_equals_the_step_op_by_op(tiny_model_dir, monkeypatch):
    torch.set_num_threads(1)
    # The tiny model's first 2 of 4 layers: two, so each layer's cache and weights are still told apart. Its two
    # graphs (top-p on, off) compiled cold (a fresh TORCHINDUCTOR_CACHE_DIR) on the 2-core machine, loaded,
    # 2026-11-28: 49 s of CPU at 4 layers, 34 at 2, 30 at 1
    model = first_layers(load(tiny_model_dir, torch.float32, "cpu"), 2)
    want = run(model)
    use_cuda_layouts(monkeypatch)  # strided q, k, v and SDPA's CUDA output layout (issue 35): one compile covers both
    same_completions(run(model, "compile"), want)


@pytest.mark.gpu
def test_the_compiled_graph_path_equals_the_eager_path(tiny_model_dir):
    model = load(tiny_model_dir, torch.float32, "cuda")
    same_completions(run(model, "compile"), run(model))


@pytest.mark.parametrize("layers", [1, 2])
def test_the_compiled_step_at_smollm2s_shape_launches_a_pinned_number_of_kernels(layers):
    torch.set_num_threads(1)
    torch._dynamo.reset()  # counted from a fresh compile, not another test's cached code
    batch = admitted(smollm2_shape(layers))
    with torch.no_grad():
        assert compiled_launches(batch.decode_step, 1, 9, False) == COMPILED_BASE + COMPILED_PER_LAYER * layers

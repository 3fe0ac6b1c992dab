"""The embedded engine's decode step compiled by torch.compile (inference.graphs = "compile"), which
starts compiler processes: on the CPU, compiled and run as it is; on CUDA (gpu-marked), compiled
then recorded as CUDA graphs. Either gives the requests' tokens of the step run op by op, and
their log-probs to float noise. On the CPU the compiled step runs on the memory layouts CUDA's
kernels hand the attention (tests/unit/inference/test_cuda_layouts.py's stand-ins: Inductor's
lowering of them, which that unit tier cannot start)."""

import pytest
import torch

from tests.support.hf_batches import BUDGETS, load, run
from tests.unit.inference.test_cuda_layouts import use_cuda_layouts


def same_completions(got: dict, want: dict) -> None:
    assert len(got) == 9 and {len(t) for t, _ in got.values()} == BUDGETS
    assert all(got[i][0] == want[i][0] for i in want)
    assert all(got[i][1] == pytest.approx(want[i][1], abs=1e-4) for i in want)


def test_the_compiled_step_on_the_cpu_equals_the_step_op_by_op(tiny_model_dir, monkeypatch):
    torch.set_num_threads(1)
    model = load(tiny_model_dir, torch.float32, "cpu")
    want = run(model)
    use_cuda_layouts(monkeypatch)  # strided q, k, v and SDPA's CUDA output layout (issue 35): one compile covers both
    same_completions(run(model, "compile"), want)


@pytest.mark.gpu
def test_the_compiled_graph_path_equals_the_eager_path(tiny_model_dir):
    model = load(tiny_model_dir, torch.float32, "cuda")
    same_completions(run(model, "compile"), run(model))

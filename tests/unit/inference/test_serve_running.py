"""What the inference server says it runs is what its engine runs: serve.py hands the engine the
config's device, dtype and graph mode (auto decided by devices.resolve), and /health's `running`
reads the loaded weights and the scheduler's decode step, not the config. On this CPU the compiled
step is only wrapped, never compiled (torch.compile is lazy: the first decode would compile it), so
no compiler process starts; `capture`, CUDA's recorded graphs, is the gpu test's
(tests/integration/test_rl_gpu.py)."""

import pytest
import torch
from fastapi.testclient import TestClient

from composer_prime.config import InferenceConfig
from composer_prime.inference import devices
from composer_prime.inference.serve import make_engine
from composer_prime.inference.server import ServerState, build_app


def config(tmp_path, **asked) -> InferenceConfig:
    return InferenceConfig(model="tiny", engine="hf", output_dir=tmp_path, **asked)


@pytest.mark.parametrize("cuda, asked, want", [
    (True, {}, ("cuda", "bfloat16", "capture")),  # a GPU's defaults, decided where the engine is built
    (False, {}, ("cpu", "float32", "off")),
    (False, {"device": "cpu", "dtype": "bfloat16", "graphs": "compile"}, ("cpu", "bfloat16", "compile")),
    (True, {"dtype": "float32", "graphs": "off"}, ("cuda", "float32", "off")),
])
def test_the_engine_is_built_with_the_configs_device_dtype_and_graphs(tmp_path, monkeypatch, cuda, asked, want):
    monkeypatch.setattr(devices, "cuda_available", lambda: cuda)
    engine = make_engine(config(tmp_path, **asked), "unused: nothing is loaded until start")
    assert (engine.device, engine.dtype, engine.graphs) == want


@pytest.mark.parametrize("asked, want", [
    ({"dtype": "bfloat16", "graphs": "compile"}, {"device": "cpu", "dtype": "bfloat16", "graphs": "compile"}),
    ({"dtype": "float32", "graphs": "off"}, {"device": "cpu", "dtype": "float32", "graphs": "off"}),
])
def test_health_reports_the_loaded_weights_and_the_step_that_runs(tmp_path, tiny_model_dir, asked, want):
    engine = make_engine(config(tmp_path, device="cpu", max_batch=2, max_model_len=64, **asked), str(tiny_model_dir))
    threads = torch.get_num_threads()
    try:
        engine.load()  # the model and the decode step, without the serving thread
    finally:
        torch.set_num_threads(threads)  # the engine pins one thread on the CPU; the test process keeps its own
    engine.dtype = engine.graphs = "what the config said"  # read from the objects, never from these
    health = TestClient(build_app(ServerState(engine, str(tiny_model_dir)))).get("/health").json()
    assert health["running"] == {**want, "graphs_recorded": 0}  # recorded graphs are CUDA's only

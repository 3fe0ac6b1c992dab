"""Where the embedded engine runs when the config says auto, and a device this machine lacks refused."""

import pytest

from composer_prime.inference import devices


@pytest.mark.parametrize("cuda, asked, want", [
    (True, ("auto", "auto", "auto"), ("cuda", "bfloat16", "capture")),
    (False, ("auto", "auto", "auto"), ("cpu", "float32", "off")),
    (True, ("cpu", "auto", "auto"), ("cpu", "float32", "off")),
    (True, ("auto", "float32", "compile"), ("cuda", "float32", "compile")),
    (False, ("cpu", "bfloat16", "off"), ("cpu", "bfloat16", "off")),
    (False, ("auto", "auto", "compile"), ("cpu", "float32", "compile")),  # on the CPU: compiled, no graphs
])
def test_auto_is_decided_by_what_torch_sees(monkeypatch, cuda, asked, want):
    monkeypatch.setattr(devices, "cuda_available", lambda: cuda)
    assert devices.resolve(*asked) == want


def test_cuda_is_refused_where_there_is_none_and_graphs_need_it(monkeypatch):
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        devices.check_device("cuda")
    devices.check_device("auto")  # decided at start: the CPU here
    with pytest.raises(ValueError, match="needs CUDA"):
        devices.resolve("auto", "auto", "capture")

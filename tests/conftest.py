import os
from pathlib import Path

import pytest

from composer_prime.utils.net import free_port  # noqa: F401 - tests import it from here

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked `gpu` run only where CUDA is available; elsewhere they are skipped with that reason."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason="needs CUDA (a gpu test), and torch sees no CUDA device here"))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The project's tiny default model (built once, then cached by content hash)."""
    from composer_prime.model.tiny import ensure_tiny_model

    return ensure_tiny_model()


def start_until_ready(cmd: list[str], probe, timeout_s: float = 240.0):
    """Start a server process and wait until `probe()` is true (connection errors count as not yet)."""
    import subprocess
    import time

    import httpx

    proc = subprocess.Popen(cmd, cwd=ROOT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if probe():
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"{' '.join(cmd[:4])} did not become ready in {timeout_s:.0f}s")


@pytest.fixture(scope="module")
def hf_inference(tiny_model_dir, tmp_path_factory):
    """Our inference server (embedded engine) on the tiny model; yields its URL."""
    import sys

    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_until_ready([sys.executable, "-m", "composer_prime.entrypoints.inference", "--model", str(tiny_model_dir),
                              "--engine", "hf", "--port", str(port), "--output_dir", str(tmp_path_factory.mktemp("inference"))],
                             lambda: httpx.get(f"{url}/health").status_code == 200)
    yield url
    proc.terminate()
    proc.wait(timeout=30)

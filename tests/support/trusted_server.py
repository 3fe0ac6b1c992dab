"""A trusted inference server at weights v1 for the volunteers' tests (test_volunteers.py,
test_volunteers_vllm.py), and the pool run against it: the tiny model after one real step of the
trainer's optimizer, served from a step directory as a run serves it."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest

from composer_prime.contract.weights import Directory
from composer_prime.transports.weights.filesystem import step_dir
from composer_prime.utils.net import free_port
from tests.conftest import start_until_ready
from tests.support import volunteers as V

PROMPT = [(7 * i) % 250 + 3 for i in range(30)]


def serve_v1(model_dir, root, *flags: str, engine: str = "hf"):
    """A trusted server (its process, url) serving the step v1 in `root`."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_until_ready([sys.executable, "-m", "composer_prime.entrypoints.inference", "--model", str(model_dir),
                              "--engine", engine, "--port", str(port), "--output_dir", str(root.parent / f"inference-{port}"),
                              *flags], lambda: httpx.get(f"{url}/health").status_code == 200)
    assert httpx.post(f"{url}/update_weights", json={"path": str(step_dir(root, 1)), "version": 1}).status_code == 200
    return proc, url


@pytest.fixture(scope="module")
def trusted(tiny_model_dir, tmp_path_factory):
    """(url, weights root): a trusted server at v1, the step a run's trainer would have published: the
    tiny model (v0) after one real step of the trainer's optimizer (V.one_step)."""
    root = tmp_path_factory.mktemp("weights")
    V.one_step(tiny_model_dir, root, ["reverse the letters of this sentence", "the quick brown fox jumps over the lazy dog"])
    proc, url = serve_v1(tiny_model_dir, root)
    yield url, root
    proc.terminate()
    proc.wait(timeout=30)


def run(trusted, tmp_path, body, **volunteers):
    url, root = trusted

    async def go():
        async with V.pool_run(url, "tiny", tmp_path / "run", **volunteers) as (client, pool):
            pool.weights = Directory(str(root))
            return await body(client, pool)
    return asyncio.run(go())

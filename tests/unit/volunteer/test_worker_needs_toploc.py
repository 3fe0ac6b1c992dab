"""A worker where TOPLOC is not installed stops before it joins (volunteer/worker.py, `Worker.run`), with
the line the worker entrypoint prints (exit code 2). Before, only the entrypoint checked it, so a worker
started from code (the volunteers benchmark, the GPU check's calibration step) joined, took leases,
failed each one ("lease ... not done") and waited out their deadlines: the GPU check's step ran into its
60 s box on a CPython 3.12 stand-in for the GPU image, which has no toploc."""

import asyncio
import sys

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from composer_prime.config.volunteers import WorkerConfig
from composer_prime.verify.toploc import ProofError
from composer_prime.volunteer.worker import Worker


def test_no_toploc_stops_the_worker_before_it_joins(monkeypatch, tmp_path):
    joined = []

    async def join(self):
        joined.append(1)
    monkeypatch.setattr(Worker, "join", join)
    cfg = WorkerConfig(join="http://127.0.0.1:9", token="t", key_path=tmp_path / "k", work_dir=tmp_path / "w", device="cpu")
    monkeypatch.setitem(sys.modules, "toploc", None)  # `import toploc` raises ImportError, as where it is missing
    with pytest.raises(ProofError, match=r"^TOPLOC is not installed .*: run `uv run composer-prime toploc install`$"):
        asyncio.run(Worker(cfg, Ed25519PrivateKey.generate()).run())
    assert joined == []
    monkeypatch.delitem(sys.modules, "toploc")  # installed here: the same worker gets as far as joining
    with pytest.raises(AttributeError):  # the patched join answers nothing, which the worker then reads
        asyncio.run(Worker(cfg, Ed25519PrivateKey.generate()).run())
    assert joined == [1]

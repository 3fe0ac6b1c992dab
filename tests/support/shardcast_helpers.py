"""Shared pieces of the SHARDCAST tests: step directories as the trainer writes them, an origin,
our relay as a real process, and a downloader. Test modules import the fixtures they use."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from composer_prime.contract.weights import Shardcast
from composer_prime.transports.weights.shardcast.client import Downloader
from composer_prime.transports.weights.shardcast.manifest import load_or_create_key, public_hex
from composer_prime.transports.weights.shardcast.origin import Origin

from tests.conftest import ROOT, free_port
from tests.support import forkserver

SHARD = 64 * 1024


def make_step(root: Path, step: int, size: int = 300_000, weights: torch.Tensor | None = None) -> Path:
    """A step directory as the trainer writes it; random weights of about `size` bytes unless given."""
    d = root / f"step_{step}"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "test", "hidden_size": 8}))
    save_file({"w": torch.randn(size // 4) if weights is None else weights}, d / "model.safetensors")
    (d / "tokenizer.json").write_text('{"v": 1}')
    (d / "STABLE").write_text("x")
    return d


def same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir() if p.name != "STABLE")
    return names == sorted(p.name for p in b.iterdir() if p.name != "STABLE") and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names)


@pytest.fixture
def origin(tmp_path):
    key = load_or_create_key(tmp_path / "keys" / "trainer.ed25519")
    o = Origin(tmp_path / "origin", key, port=free_port(), shard_size=SHARD, keep_last=3).start()
    o.public_key = public_hex(key)
    yield o
    o.stop()


def downloader(tmp_path: Path, servers: list[str], key: str, name: str = "client", **kw) -> Downloader:
    return Downloader(Shardcast(tuple(servers), key), tmp_path / name / "work", **kw)


def fetch(dl: Downloader, step: int, dest: Path, **kw) -> Path:
    async def go():
        try:
            return await dl.fetch(step, dest, **kw)
        finally:
            await dl.close()
    return asyncio.run(go())


class RelayProc:
    """Our relay as a real process (`relay` entrypoint)."""

    def __init__(self, tmp: Path, upstream: list[str], key: str, name: str) -> None:
        self.port = free_port()
        self.dir = tmp / name
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = forkserver.Popen(
            [sys.executable, "-m", "composer_prime.entrypoints.relay", "--upstream", ",".join(upstream),
             "--public_key", key, "--port", str(self.port), "--data_dir", str(self.dir), "--poll_wait_s", "5"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_step(self, step: int, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if (self.dir / f"v{step}" / "complete").exists():
                return
            assert self.proc.poll() is None, "relay died"
            time.sleep(0.1)
        raise TimeoutError(f"relay did not mirror step {step}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def relays(tmp_path):
    started: list[RelayProc] = []
    yield lambda upstream, key, name: started.append(RelayProc(tmp_path, upstream, key, name)) or started[-1]
    for r in started:
        r.kill()

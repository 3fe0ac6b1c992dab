"""The trainer's end of the weight broadcast: after `weights/step_N` is written, make it reach inference."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import httpx

from composer_prime.transports.weights import filesystem


class Publisher(Protocol):
    def publish(self, step: int, path: Path) -> None: ...
    def close(self) -> None: ...


class FilesystemPublisher:
    """Inference reads the shared directory; tell each server to load it (with the run's token, if any)."""

    def __init__(self, urls: list[str], token: str | None = None) -> None:
        self.urls, self.token = urls, token

    def publish(self, step: int, path: Path) -> None:
        filesystem.notify_inference(self.urls, path, step, self.token)

    def close(self) -> None:
        pass


class ShardcastPublisher:
    """Run the SHARDCAST origin; inference nodes pull, verify and load on their own."""

    def __init__(self, key_path: Path, work_dir: Path, host: str, port: int, shard_size: int, keep_last: int,
                 delta: bool, urls: list[str]) -> None:
        from composer_prime.transports.weights.shardcast.manifest import load_or_create_key
        from composer_prime.transports.weights.shardcast.origin import Origin

        # The key exists (the trainer entrypoint checks): made by `rl` or `composer-prime keys make`, so
        # inference nodes were given its public half.
        self.origin = Origin(work_dir, load_or_create_key(key_path), host, port, shard_size, keep_last, delta=delta).start()
        self.urls, self.last = urls, -1

    def publish(self, step: int, path: Path) -> None:
        self.origin.publish(step, path)
        self.last = step

    def close(self, timeout_s: float = 300.0) -> None:
        # Inference pulls: keep serving until the servers we know of hold the last step (or give up).
        deadline = time.time() + timeout_s
        while self.urls and time.time() < deadline:
            try:
                if min(httpx.get(f"{u}/health", timeout=5).json()["weight_version"] for u in self.urls) >= self.last:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        self.origin.stop()

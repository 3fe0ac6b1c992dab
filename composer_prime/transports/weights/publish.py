"""The trainer's end of the weight broadcast: after `weights/step_N` is written, make it reach inference."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import httpx

from composer_prime.config import TrainerConfig
from composer_prime.transports.weights import filesystem


class Publisher(Protocol):
    def publish(self, step: int, path: Path) -> None: ...
    def close(self) -> None: ...


class FilesystemPublisher:
    """Inference reads the shared directory; tell each server to load it."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    def publish(self, step: int, path: Path) -> None:
        filesystem.notify_inference(self.urls, path, step)

    def close(self) -> None:
        pass


class ShardcastPublisher:
    """Run the SHARDCAST origin; inference nodes pull, verify and load on their own."""

    def __init__(self, cfg: TrainerConfig) -> None:
        from composer_prime.transports.weights.shardcast import Origin, load_or_create_key

        wb = cfg.weight_broadcast
        key = load_or_create_key(wb.key_path or Path(cfg.output_dir) / "keys" / "trainer.ed25519")
        self.origin = Origin(Path(cfg.output_dir) / "shardcast", key, wb.host, wb.port, wb.shard_size, wb.keep_last,
                             delta=wb.delta).start()
        self.urls, self.last = cfg.inference_urls, -1

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


def make_publisher(cfg: TrainerConfig) -> Publisher:
    if cfg.weight_broadcast.type == "shardcast":
        return ShardcastPublisher(cfg)
    return FilesystemPublisher(cfg.inference_urls)

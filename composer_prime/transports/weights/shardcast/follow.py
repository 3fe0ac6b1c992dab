"""Inference's side: follow the newest step on SHARDCAST servers, verify it, hot-load it."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from composer_prime.transports.weights.shardcast.client import Downloader, DownloadError
from composer_prime.transports.weights.shardcast.manifest import VerificationError
from composer_prime.transports.weights.shardcast.origin import model_hash


async def follow(servers: list[str], public_key: str, base_model_dir: str, work_dir: Path,
                 current: Callable[[], int], load: Callable[[str, int], Awaitable[None]],
                 log: Callable[[str], None] = print, wait_s: float = 30.0) -> None:
    """Forever: long-poll for a step newer than `current()`, download and verify it, `load` it.

    Only the newest step is fetched (an intermediate one would be stale on arrival). A step that
    fails verification or loading is logged, counted and never served; the next one is tried."""
    if not public_key:
        raise ValueError("weight_broadcast.public_key is required for shardcast (the trainer's ed25519 key, hex)")
    config = Path(base_model_dir) / "config.json"  # absent when the model is a hub id resolved by transformers
    dl = Downloader(servers, public_key, work_dir / "incoming", log=log,
                    expect_model_hash=model_hash(config.parent) if config.exists() else None)
    steps_dir = work_dir / "weights"
    try:
        while True:
            latest = await dl.latest(after=current(), wait_s=wait_s)
            if latest <= current():
                await asyncio.sleep(1.0 if latest < 0 else 0.1)
                continue
            try:
                path = await dl.fetch(latest, steps_dir / f"step_{latest}")
                await load(str(path), latest)
            except (DownloadError, VerificationError) as e:
                log(f"[shardcast] step {latest} not loaded: {e} (stats {dict(dl.stats)})")
                await asyncio.sleep(2.0)
                continue
            except Exception as e:  # noqa: BLE001 - the engine refused a verified step: keep serving the old one
                log(f"[shardcast] engine refused step {latest}: {e}")
                await asyncio.sleep(2.0)
                continue
            log(f"[shardcast] loaded step {latest} ({dl.stats['bytes']:,} bytes fetched so far)")
            for old in steps_dir.glob("step_*"):  # keep the serving step (vLLM may re-read it) and nothing older
                if old.name != f"step_{latest}":
                    shutil.rmtree(old, ignore_errors=True)
    finally:
        await dl.close()

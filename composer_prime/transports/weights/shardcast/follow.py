"""Inference's side: follow the newest step on SHARDCAST servers, verify it, hot-load it."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from composer_prime.contract.weights import Shardcast
from composer_prime.transports.weights.shardcast.client import Downloader, DownloadError
from composer_prime.transports.weights.shardcast.manifest import VerificationError
from composer_prime.transports.weights.shardcast.origin import model_hash
from composer_prime.utils import steps

log = logging.getLogger(__name__)


async def follow(source: Shardcast, base_model_dir: str, work_dir: Path,
                 current: Callable[[], int], load: Callable[[str, int], Awaitable[None]],
                 wait_s: float = 30.0, keep: int = 1) -> None:
    """Forever: long-poll for a step newer than `current()`, download and verify it, `load` it.
    When no server answers (a relay's host cut off), it says so once, keeps serving, and says when
    one answers again.

    Only the newest step is fetched (an intermediate one would be stale on arrival). A step that
    fails verification or loading is logged, counted and never served; the next one is tried.
    `work_dir/stats.json` holds the counts after every attempt: the last step loaded, the steps
    refused, and the downloader's own counters (bytes, shards, retries)."""
    if not source.public_key:
        raise ValueError("weight_broadcast.public_key is required for shardcast (the trainer's ed25519 key, hex)")
    config = Path(base_model_dir) / "config.json"  # absent when the model is a hub id resolved by transformers
    dl = Downloader(source, work_dir / "incoming",
                    expect_model_hash=model_hash(config.parent) if config.exists() else None)
    steps_dir = work_dir / "weights"
    refused = 0

    def record(loaded: int | None) -> None:
        tmp = work_dir / "stats.json.tmp"
        tmp.write_text(json.dumps({"loaded_step": loaded, "refused_steps": refused, **dl.stats}))
        tmp.replace(work_dir / "stats.json")

    loaded: int | None = None
    # None until a server answers (at start the origin may not be up yet: no outage to speak of);
    # then whether none answered the last poll: said once, and again when one does
    unanswered: bool | None = None
    try:
        while True:
            failed = dl.stats["failed_request"]
            latest = await dl.latest(after=current(), wait_s=wait_s)
            if dl.stats["failed_request"] - failed < len(source.servers):
                if unanswered:
                    log.info(f"a weight server answers again ({', '.join(source.servers)}): serving step {current()}")
                unanswered = False
            elif unanswered is False:
                log.warning(f"no weight server answers ({', '.join(source.servers)}): serving step {current()} until one does")
                unanswered = True
            if latest <= current():
                await asyncio.sleep(1.0 if latest < 0 else 0.1)
                continue
            try:
                path = await dl.fetch(latest, steps.step_path(steps_dir, latest))
                await load(str(path), latest)
            except (DownloadError, VerificationError) as e:
                log.warning(f"step {latest} not loaded: {e} (stats {dict(dl.stats)})")
                refused += 1
                record(loaded)
                await asyncio.sleep(2.0)
                continue
            except Exception as e:  # noqa: BLE001 - the engine refused a verified step: keep serving the old one
                log.warning(f"engine refused step {latest}: {e}")
                refused += 1
                record(loaded)
                await asyncio.sleep(2.0)
                continue
            log.info(f"loaded step {latest} ({dl.stats['bytes']:,} bytes fetched so far)")
            loaded = latest
            record(loaded)
            steps.prune(steps_dir, max(1, keep))  # the serving step (vLLM may re-read it) and the newest before it
    finally:
        await dl.close()

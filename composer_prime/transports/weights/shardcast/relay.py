"""A relay: mirrors upstream servers (our origin, our relays or `shardcast` relays) and re-serves.

It learns new steps by long-polling upstream, verifies each manifest's signature before listing
the step, and passes every shard on the moment it has verified it (downstream requests for a
shard still in flight wait for it). It never serves a byte it has not verified.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from composer_prime.contract.weights import Shardcast
from composer_prime.transports.weights.shardcast.client import Downloader, DownloadError
from composer_prime.transports.weights.shardcast.manifest import Shard
from composer_prime.transports.weights.shardcast.store import MANIFEST, SIGNATURE, Store, version_name

log = logging.getLogger(__name__)


class Relay:
    def __init__(self, upstream: Shardcast, root: Path, keep_last: int = 3, poll_wait_s: float = 30.0) -> None:
        self.store = Store(root)
        self.downloader = Downloader(upstream, root / ".incoming")
        self.keep_last, self.poll_wait_s = max(1, keep_last), poll_wait_s

    def have(self) -> set[int]:
        return {s for s in self.store.distribution() if (self.store.root / version_name(s) / "complete").exists()}

    async def mirror(self, step: int) -> None:
        manifest, raw, sig = await self.downloader.manifest(step)
        vdir = self.store.root / version_name(step)
        vdir.mkdir(parents=True, exist_ok=True)
        (vdir / MANIFEST).write_bytes(raw)
        (vdir / SIGNATURE).write_bytes(sig)
        if (d := manifest.delta) is not None:  # small: have it before listing, nodes that hold the base want it first
            try:
                await self.downloader.fetch_file(step, 0, Shard(d.name, d.size, d.blake3), vdir)
            except DownloadError as e:
                log.warning(f"step {step}: no delta ({e}); nodes will fetch the full step")
        entries = self.store.distribution()
        entries[step] = (manifest.total_blake3, len(manifest.shards))
        self.store.write_distribution(entries)  # listed now: downstream may start while shards stream in
        self.store.changed()
        await self.downloader.shards(manifest, vdir, on_shard=lambda _: self.store.changed())
        (vdir / "complete").write_text("")
        keep = set(sorted(self.store.distribution())[-self.keep_last:])
        self.store.retain(keep)
        self.store.changed()
        log.info(f"step {step} mirrored ({len(manifest.shards)} shards, {manifest.total_size:,} bytes)")

    async def run(self) -> None:
        while True:
            have = self.have()
            latest = await self.downloader.latest(after=max(have, default=-1), wait_s=self.poll_wait_s)
            if latest < 0 or latest in have:
                await asyncio.sleep(1.0)  # nothing new, or no upstream answered
                continue
            try:
                await self.mirror(latest)  # only the newest: intermediate steps are stale for inference anyway
            except DownloadError as e:
                log.warning(f"step {latest}: {e}; retrying")
                await asyncio.sleep(2.0)


async def serve(relay: Relay, host: str, port: int) -> None:
    """Serve the relay's store over HTTP while it mirrors upstream; runs until cancelled."""
    from composer_prime.transports.weights.shardcast.store import build_app, start_site

    runner = await start_site(build_app(relay.store, "shardcast-relay"), host, port)
    try:
        await relay.run()
    finally:
        await runner.cleanup()
        await relay.downloader.close()

"""Download a step from any set of SHARDCAST servers and hand over only what verifies.

The manifest may come from any server (its signature is the proof); each shard is fetched
concurrently from a server chosen per shard, checked for size and blake3 on arrival, fetched
again from another server when it fails, and resumed with a byte range when a partial `.part`
file is left from an interrupted attempt. Only a fully verified payload is unpacked, and the
step directory's marker is written last.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx

from composer_prime.transports.weights.shardcast import payload
from composer_prime.transports.weights.shardcast.manifest import Manifest, Shard, VerificationError, verify
from composer_prime.transports.weights.shardcast.store import (
    DISTRIBUTION,
    MANIFEST,
    SIGNATURE,
    parse_distribution,
    version_name,
)

MARKER = "STABLE"  # the same marker the filesystem broadcast writes last


class DownloadError(Exception):
    pass


class Downloader:
    def __init__(self, servers: list[str], public_key: str, work_dir: Path, expect_model_hash: str | None = None,
                 concurrency: int = 8, rounds: int = 5, timeout_s: float = 60.0, log: Callable[[str], None] = print) -> None:
        if not servers:
            raise ValueError("no SHARDCAST servers configured")
        self.servers = [s.rstrip("/") for s in servers]
        self.public_key, self.work_dir, self.expect_model_hash = public_key, Path(work_dir), expect_model_hash
        self.concurrency, self.rounds, self.log = concurrency, rounds, log
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0))
        self.stats: Counter[str] = Counter()  # bad_signature, bad_shard, failed_request, bytes, resumed, steps

    async def close(self) -> None:
        await self.http.aclose()

    # ---- discovery ----
    async def latest(self, after: int, wait_s: float = 30.0) -> int:
        """The newest step any server lists; long-polls our servers, reads distribution.txt of others."""
        best = -1
        for server in random.sample(self.servers, len(self.servers)):
            try:
                r = await self.http.get(f"{server}/latest", params={"after": after, "wait": wait_s},
                                        timeout=wait_s + 10)
                if r.status_code == 200:
                    best = max(best, int(r.json()["latest"]))
                else:  # a plain SHARDCAST server: no long-poll route
                    r = await self.http.get(f"{server}/{DISTRIBUTION}")
                    r.raise_for_status()
                    best = max([best, *parse_distribution(r.text)])
                if best > after:
                    return best
            except (httpx.HTTPError, ValueError, KeyError):
                self.stats["failed_request"] += 1
        return best

    # ---- manifest ----
    async def manifest(self, step: int) -> tuple[Manifest, bytes, bytes]:
        """The verified manifest of `step`, with its raw bytes and signature (relays re-serve them)."""
        v = version_name(step)
        for server in random.sample(self.servers, len(self.servers)):
            try:
                raw = await self._get(f"{server}/{v}/{MANIFEST}")
                sig = await self._get(f"{server}/{v}/{SIGNATURE}")
            except httpx.HTTPError:
                self.stats["failed_request"] += 1
                continue  # e.g. a plain SHARDCAST relay, which carries shards only
            try:
                m = verify(raw, sig, self.public_key)
                if m.step != step:
                    raise VerificationError(f"manifest is for step {m.step}, not {step}")
                if self.expect_model_hash and m.model_hash != self.expect_model_hash:
                    raise VerificationError("manifest is for another model (config hash differs)")
            except VerificationError as e:
                self.stats["bad_signature"] += 1
                self.log(f"[shardcast] rejected manifest of step {step} from {server}: {e}")
                continue
            return m, raw, sig
        raise DownloadError(f"no server has a valid signed manifest for step {step}")

    async def _get(self, url: str) -> bytes:
        r = await self.http.get(url)
        r.raise_for_status()
        return r.content

    # ---- shards ----
    async def shards(self, manifest: Manifest, out_dir: Path, on_shard: Callable[[Shard], None] | None = None) -> None:
        """Every shard of `manifest` into `out_dir`, verified; `on_shard` runs as each one lands."""
        out_dir.mkdir(parents=True, exist_ok=True)
        sem = asyncio.Semaphore(self.concurrency)

        async def one(i: int, shard: Shard) -> None:
            async with sem:
                await self._shard(manifest.step, i, shard, out_dir)
            if on_shard is not None:
                on_shard(shard)

        await asyncio.gather(*(one(i, s) for i, s in enumerate(manifest.shards)))

    async def _shard(self, step: int, index: int, shard: Shard, out_dir: Path) -> None:
        final, part = out_dir / shard.name, out_dir / (shard.name + ".part")
        if final.exists() and final.stat().st_size == shard.size and payload.file_blake3(final) == shard.blake3:
            return  # verified by an earlier, interrupted attempt
        order = self.servers[index % len(self.servers):] + self.servers[: index % len(self.servers)]  # spread load
        for attempt in range(self.rounds * len(order)):
            server = order[attempt % len(order)]
            if attempt and attempt % len(order) == 0:
                await asyncio.sleep(min(2.0 ** (attempt // len(order)), 10.0))
            try:
                await self._fetch(f"{server}/{version_name(step)}/{shard.name}", part, shard.size)
            except httpx.HTTPError as e:
                self.stats["failed_request"] += 1
                self.log(f"[shardcast] {shard.name} of step {step} from {server}: {type(e).__name__}; trying another server")
                continue
            if part.stat().st_size == shard.size and payload.file_blake3(part) == shard.blake3:
                os.replace(part, final)
                return
            self.stats["bad_shard"] += 1
            self.log(f"[shardcast] {shard.name} of step {step} from {server} failed verification; fetching it elsewhere")
            part.unlink(missing_ok=True)
        raise DownloadError(f"{shard.name} of step {step}: no server gave a verified copy")

    async def _fetch(self, url: str, part: Path, size: int) -> None:
        have = part.stat().st_size if part.exists() else 0
        if have >= size:
            part.unlink()
            have = 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        async with self.http.stream("GET", url, headers=headers) as r:
            r.raise_for_status()
            if have and r.status_code == 206:
                self.stats["resumed"] += 1
            elif have:  # the server ignored the range: start over
                have = 0
            with part.open("ab" if have else "wb") as f:
                async for chunk in r.aiter_bytes():
                    if f.tell() + len(chunk) > size:
                        raise httpx.HTTPError("server sent more bytes than the manifest allows")
                    f.write(chunk)
                    self.stats["bytes"] += len(chunk)

    # ---- a whole step ----
    async def fetch(self, step: int, dest: Path, manifest: Manifest | None = None) -> Path:
        """Download, verify and unpack `step` into `dest` (marker written last); returns `dest`."""
        if (dest / MARKER).exists():
            return dest
        manifest = manifest or (await self.manifest(step))[0]
        shard_dir = self.work_dir / f"{version_name(step)}.incoming"
        await self.shards(manifest, shard_dir)
        tar = shard_dir / "payload.tar"
        staging = dest.with_name(dest.name + ".tmp")
        try:
            payload.join(manifest, shard_dir, tar)
            shutil.rmtree(staging, ignore_errors=True)
            payload.extract(tar, staging)
        except VerificationError:
            self.stats["bad_shard"] += 1
            shutil.rmtree(shard_dir, ignore_errors=True)
            raise
        (staging / MARKER).write_text(str(step))
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(staging, dest)
        shutil.rmtree(shard_dir, ignore_errors=True)
        self.stats["steps"] += 1
        return dest

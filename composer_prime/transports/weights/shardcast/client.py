"""Download a step from any set of SHARDCAST servers and hand over only what verifies.

The manifest may come from any server (its signature is the proof); each shard is fetched
concurrently from a server chosen per shard, checked for size and blake3 on arrival, fetched
again from another server when it fails, and resumed with a byte range when a partial `.part`
file is left from an interrupted attempt. Only a fully verified payload is unpacked, and the
step directory's marker is written last.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
from blake3 import blake3

from composer_prime.contract.weights import Shardcast
from composer_prime.transports.weights.shardcast import payload
from composer_prime.transports.weights.shardcast.manifest import Manifest, Shard, VerificationError, verify
from composer_prime.transports.weights.shardcast.store import (
    DISTRIBUTION,
    MANIFEST,
    SIGNATURE,
    parse_distribution,
    version_name,
)

log = logging.getLogger(__name__)

MARKER = "STABLE"  # the same marker the filesystem broadcast writes last
REBUILT = "payload.bin"  # a payload rebuilt from a delta, kept as the next delta's base
COUNTS = ("steps", "bytes", "resumed", "delta_steps", "delta_failed", "bad_signature", "bad_shard", "failed_request")


class DownloadError(Exception):
    pass


class TransferError(Exception):
    """A server misbehaved mid-transfer: try another."""


TRANSFER_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError, TransferError)


class Downloader:
    def __init__(self, source: Shardcast, work_dir: Path, expect_model_hash: str | None = None,
                 concurrency: int = 8, rounds: int = 5, timeout_s: float = 60.0) -> None:
        """`source`: the servers to read from and the key every step is signed with (contract/weights.py)."""
        if not source.servers:
            raise ValueError("no SHARDCAST servers configured")
        self.servers = [s.rstrip("/") for s in source.servers]
        self.public_key, self.work_dir, self.expect_model_hash = source.public_key, Path(work_dir), expect_model_hash
        self.concurrency, self.rounds = concurrency, rounds
        self.timeout = aiohttp.ClientTimeout(sock_connect=5.0, sock_read=timeout_s)
        self._http: aiohttp.ClientSession | None = None  # made in the event loop that uses it
        # every count from the start, zeros too: stats.json's readers find each key whether or not it happened
        self.stats: Counter[str] = Counter(dict.fromkeys(COUNTS, 0))

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=self.timeout)
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    # ---- discovery ----
    async def latest(self, after: int, wait_s: float = 30.0) -> int:
        """The newest step any server lists; long-polls our servers, reads distribution.txt of others."""
        best = -1
        for server in random.sample(self.servers, len(self.servers)):
            try:
                async with self.http.get(f"{server}/latest", params={"after": after, "wait": wait_s},
                                         timeout=aiohttp.ClientTimeout(total=wait_s + 10)) as r:
                    ours = r.status == 200
                    if ours:
                        best = max(best, int((await r.json())["latest"]))
                if not ours:  # a plain SHARDCAST server: no long-poll route
                    best = max([best, *parse_distribution((await self._get(f"{server}/{DISTRIBUTION}")).decode())])
                if best > after:
                    return best
            except (*TRANSFER_ERRORS, ValueError, KeyError):
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
            except TRANSFER_ERRORS:
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
                log.warning(f"rejected manifest of step {step} from {server}: {e}")
                continue
            return m, raw, sig
        raise DownloadError(f"no server has a valid signed manifest for step {step}")

    async def _get(self, url: str) -> bytes:
        async with self.http.get(url, raise_for_status=True) as r:
            return await r.read()

    # ---- shards ----
    async def shards(self, manifest: Manifest, out_dir: Path, on_shard: Callable[[Shard], None] | None = None) -> None:
        """Every shard of `manifest` into `out_dir`, verified; `on_shard` runs as each one lands."""
        out_dir.mkdir(parents=True, exist_ok=True)
        sem = asyncio.Semaphore(self.concurrency)

        async def one(i: int, shard: Shard) -> None:
            async with sem:
                await self.fetch_file(manifest.step, i, shard, out_dir)
            if on_shard is not None:
                on_shard(shard)

        await asyncio.gather(*(one(i, s) for i, s in enumerate(manifest.shards)))

    async def fetch_file(self, step: int, index: int, shard: Shard, out_dir: Path) -> None:
        """One file of `step` (a shard or a delta) into `out_dir`, verified against `shard`; fails over."""
        final, part = out_dir / shard.name, out_dir / (shard.name + ".part")
        if final.exists() and final.stat().st_size == shard.size and payload.file_blake3(final) == shard.blake3:
            return  # verified by an earlier, interrupted attempt
        order = self.servers[index % len(self.servers):] + self.servers[: index % len(self.servers)]  # spread load
        for attempt in range(self.rounds * len(order)):
            server = order[attempt % len(order)]
            if attempt and attempt % len(order) == 0:
                await asyncio.sleep(min(2.0 ** (attempt // len(order)), 10.0))
            try:
                digest = await self._fetch(f"{server}/{version_name(step)}/{shard.name}", part, shard.size)
            except TRANSFER_ERRORS as e:
                self.stats["failed_request"] += 1
                log.warning(f"{shard.name} of step {step} from {server}: {type(e).__name__}; trying another server")
                continue
            if part.stat().st_size == shard.size and digest == shard.blake3:
                os.replace(part, final)
                return
            self.stats["bad_shard"] += 1
            log.warning(f"{shard.name} of step {step} from {server} failed verification; fetching it elsewhere")
            part.unlink(missing_ok=True)
        raise DownloadError(f"{shard.name} of step {step}: no server gave a verified copy")

    async def _fetch(self, url: str, part: Path, size: int) -> str:
        """Append `url` to `part` (resuming with a byte range); returns the blake3 of the whole part."""
        have = part.stat().st_size if part.exists() else 0
        if have >= size:
            part.unlink()
            have = 0
        digest = blake3()
        headers = {}
        if have:
            for chunk in payload.file_chunks([part]):
                digest.update(chunk)
            headers["Range"] = f"bytes={have}-"
        async with self.http.get(url, headers=headers, raise_for_status=True) as r:
            if have and r.status == 206:
                self.stats["resumed"] += 1
            elif have:  # the server ignored the range: start over
                have, digest = 0, blake3()
            with part.open("ab" if have else "wb") as f:
                async for chunk in r.content.iter_chunked(1 << 20):
                    if f.tell() + len(chunk) > size:
                        raise TransferError("server sent more bytes than the manifest allows")
                    f.write(chunk)
                    digest.update(chunk)
                    self.stats["bytes"] += len(chunk)
        return digest.hexdigest()

    # ---- a whole step ----
    async def fetch(self, step: int, dest: Path, manifest: Manifest | None = None) -> Path:
        """Download, verify and unpack `step` into `dest` (marker written last); returns `dest`.

        With a delta in the manifest and its base step still here, fetch only the delta; any
        failure on that path falls back to the full shards."""
        if (dest / MARKER).exists():
            return dest
        if manifest is None:
            manifest = (await self.manifest(step))[0]
        staging = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        here = self.work_dir / version_name(step)
        done = False
        if manifest.delta is not None and (base := self._payload(manifest.delta.base_step)) is not None:
            try:
                await self._delta_step(manifest, base, here, staging)
                done = True
            except (DownloadError, VerificationError, zlib.error) as e:
                self.stats["delta_failed"] += 1
                log.warning(f"delta for step {step} unusable ({e}); fetching the full step")
                shutil.rmtree(staging, ignore_errors=True)
                # the payload rebuilt from a wrong base: left here, it would be the next delta's base (and
                # every later delta would fail the same way, each step fetched in full from then on)
                (here / REBUILT).unlink(missing_ok=True)
        if not done:
            await self.shards(manifest, here)
            try:
                # Every shard was hashed against the signed manifest on arrival: no second pass over the payload.
                await asyncio.to_thread(payload.extract, payload.file_chunks(here / s.name for s in manifest.shards),
                                        staging, None, manifest.total_size)
            except VerificationError:
                self.stats["bad_shard"] += 1
                shutil.rmtree(here, ignore_errors=True)
                shutil.rmtree(staging, ignore_errors=True)
                raise
        (here / MANIFEST).write_bytes(manifest.to_bytes())  # what the next delta's base is made of
        (staging / MARKER).write_text(str(step))
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(staging, dest)
        for old in self.work_dir.glob("v*"):  # keep only this step's payload: the base of the next delta
            if old != here:
                shutil.rmtree(old, ignore_errors=True)
        self.stats["steps"] += 1
        return dest

    def _payload(self, step: int) -> Iterator[bytes] | None:
        """Chunks of a payload kept from an earlier fetch: its shards, or the file a delta rebuilt."""
        d = self.work_dir / version_name(step)
        if not (d / MANIFEST).exists():
            return None
        if (d / REBUILT).exists():
            return payload.file_chunks([d / REBUILT])
        m = Manifest.from_bytes((d / MANIFEST).read_bytes())
        return payload.file_chunks(d / s.name for s in m.shards)

    async def _delta_step(self, manifest: Manifest, base: Iterator[bytes], here: Path, staging: Path) -> None:
        d = manifest.delta
        here.mkdir(parents=True, exist_ok=True)
        await self.fetch_file(manifest.step, 0, Shard(d.name, d.size, d.blake3), here)
        rebuilt = here / REBUILT

        def tee() -> Iterator[bytes]:  # keep the rebuilt payload: the base of the next delta
            with rebuilt.open("wb") as f:
                for chunk in payload.decode_delta(base, here / d.name, d.stride):
                    f.write(chunk)
                    yield chunk

        await asyncio.to_thread(payload.extract, tee(), staging, manifest.total_blake3, manifest.total_size)
        (here / d.name).unlink()
        self.stats["delta_steps"] += 1

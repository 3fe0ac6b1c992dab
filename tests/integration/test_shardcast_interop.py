"""Interop with the real `shardcast==0.3.2` package, in both directions."""

from __future__ import annotations

import asyncio
import contextlib
import tarfile
import time
from pathlib import Path

import httpx

from composer_prime.transports.weights.shardcast.origin import Origin
from composer_prime.transports.weights.shardcast.payload import file_blake3

from tests.conftest import free_port
from tests.support.shardcast_helpers import downloader, make_step, origin, same_files  # noqa: F401


@contextlib.contextmanager
def shardcast_relay(tmp_path: Path, origin: Origin, step: int):
    """The real `shardcast` MiddleNode mirroring our origin, on loopback; yields its URL once it holds `step`."""
    import shardcast.server as scs
    from shardcast import MiddleNode

    init = scs.ShardcastServer.__init__  # it binds 0.0.0.0 with no option: keep the test on 127.0.0.1
    scs.ShardcastServer.__init__ = lambda self, addr, *a, **k: init(self, ("127.0.0.1", addr[1]), *a, **k)
    mdir = tmp_path / "sc-middle"
    mdir.mkdir()
    (mdir / "data1.bin").write_bytes(b"\0" * 1024)  # its clients probe it; its relay does not copy it
    port = free_port()
    try:
        middle = MiddleNode([origin.url], str(mdir), port=port, check_interval=1)
    finally:
        scs.ShardcastServer.__init__ = init
    try:
        deadline = time.time() + 30
        while f"v{step}" not in middle.processed_versions and time.time() < deadline:
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        middle.shutdown()
        httpx.get(f"http://127.0.0.1:{port}/data1.bin")  # its server loop exits only after one more request


def test_shardcast_relay_and_client_download_from_our_origin(tmp_path, origin):
    from shardcast import ClientNode

    src = make_step(tmp_path / "w", 3)
    m = origin.publish(3, src)
    with shardcast_relay(tmp_path, origin, 3) as url:
        out = ClientNode([url], output_dir=str(tmp_path / "sc-client")).download_version("v3")
    assert out is not None  # shardcast checked our distribution.txt's blake3 itself
    assert file_blake3(Path(out)) == m.total_blake3
    with tarfile.open(out) as tar:
        tar.extractall(tmp_path / "sc-extracted", filter="data")
    assert same_files(src, tmp_path / "sc-extracted")


def test_our_client_downloads_shards_through_a_shardcast_relay(tmp_path, origin):
    """A `shardcast` relay carries shards only; the signed manifest comes from any other server."""
    src = make_step(tmp_path / "w", 2)
    published = origin.publish(2, src)

    async def go(url: str):
        from_origin = downloader(tmp_path, [origin.url], origin.public_key, "m")
        manifest = (await from_origin.manifest(2))[0]
        await from_origin.close()
        dl = downloader(tmp_path, [url], origin.public_key)
        dest = await dl.fetch(2, tmp_path / "got" / "step_2", manifest=manifest)
        await dl.close()
        return dest, dl

    with shardcast_relay(tmp_path, origin, 2) as url:
        dest, dl = asyncio.run(go(url))
    assert same_files(src, dest) and dl.stats["bytes"] == published.total_size  # every byte via shardcast

"""SHARDCAST weight broadcast: layout, signatures, failover, resume, retention, and interop with
the real `shardcast==0.3.2` package in both directions. None of these loads unverified weights."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save_file

from composer_prime.transports.weights.shardcast import Downloader, DownloadError, Origin, load_or_create_key, public_hex
from composer_prime.transports.weights.shardcast.manifest import Manifest, sign
from composer_prime.transports.weights.shardcast.payload import file_blake3
from composer_prime.transports.weights.shardcast.store import parse_distribution

from tests.conftest import ROOT, free_port

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
    return Downloader(servers, key, tmp_path / name / "work", log=lambda m: None, **kw)


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
        self.proc = subprocess.Popen(
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


# ---------------------------------------------------------------- layout and signature

def test_origin_writes_the_shardcast_layout_with_a_signed_manifest(tmp_path, origin):
    src = make_step(tmp_path / "w", 3)
    m = origin.publish(3, src)
    root = origin.store.root
    assert parse_distribution((root / "distribution.txt").read_text()) == {3: (m.total_blake3, 5)}
    assert (root / "distribution.txt").read_text() == f"v3: {m.total_blake3}|5\n"
    shards = sorted(p.name for p in (root / "v3").glob("shard_*.bin"))
    assert shards == [f"shard_{i:05d}.bin" for i in range(1, 6)]
    assert [s.size for s in m.shards] == [SHARD] * 4 + [m.total_size - 4 * SHARD]
    assert (root / "data1.bin").exists()  # shardcast clients probe it
    on_disk = Manifest.from_bytes((root / "v3" / "manifest.json").read_bytes())
    assert on_disk == m and on_disk.step == 3


def test_download_equals_the_published_step(tmp_path, origin):
    src = make_step(tmp_path / "w", 1)
    origin.publish(1, src)
    dest = fetch(downloader(tmp_path, [origin.url], origin.public_key), 1, tmp_path / "got" / "step_1")
    assert same_files(src, dest) and (dest / "STABLE").exists()


@pytest.mark.parametrize("attack", ["other_key", "edited_manifest", "wrong_step"])
def test_bad_signature_is_rejected_and_nothing_is_loaded(tmp_path, origin, attack):
    src = make_step(tmp_path / "w", 2)
    m = origin.publish(2, src)
    vdir = origin.store.root / "v2"
    if attack == "other_key":
        (vdir / "manifest.sig").write_bytes(sign(m, load_or_create_key(tmp_path / "evil.key")))
    elif attack == "edited_manifest":  # a relay swaps in its own shard hashes, keeps the trainer's signature
        body = json.loads((vdir / "manifest.json").read_bytes())
        body["shards"][0]["blake3"] = "0" * 64
        (vdir / "manifest.json").write_bytes(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    else:  # a validly signed manifest replayed under another step
        (origin.store.root / "v7").mkdir()
        for f in vdir.iterdir():
            (origin.store.root / "v7" / f.name).write_bytes(f.read_bytes())
    dl = downloader(tmp_path, [origin.url], origin.public_key)
    step = 7 if attack == "wrong_step" else 2
    with pytest.raises(DownloadError):
        fetch(dl, step, tmp_path / "got" / f"step_{step}")
    assert dl.stats["bad_signature"] == 1
    assert not (tmp_path / "got" / f"step_{step}").exists()


# ---------------------------------------------------------------- failures on the way

@pytest.mark.parametrize("damage", ["flipped_byte", "truncated"])
def test_corrupt_shard_on_one_relay_is_fetched_from_another(tmp_path, origin, relays, damage):
    src = make_step(tmp_path / "w", 4)
    origin.publish(4, src)
    a, b = relays([origin.url], origin.public_key, "relay-a"), relays([origin.url], origin.public_key, "relay-b")
    a.wait_step(4), b.wait_step(4)
    bad = a.dir / "v4" / "shard_00001.bin"  # relay a is the first server asked for shard 1
    data = bad.read_bytes()
    bad.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:] if damage == "flipped_byte" else data[: len(data) // 2])
    dl = downloader(tmp_path, [a.url, b.url], origin.public_key, concurrency=1)
    dest = fetch(dl, 4, tmp_path / "got" / "step_4")
    assert same_files(src, dest)
    assert dl.stats["bad_shard"] >= 1


def test_every_server_corrupt_means_no_weights(tmp_path, origin):
    origin.publish(5, make_step(tmp_path / "w", 5))
    shard = origin.store.root / "v5" / "shard_00001.bin"
    shard.write_bytes(b"\0" * shard.stat().st_size)
    dl = downloader(tmp_path, [origin.url], origin.public_key, rounds=2)
    with pytest.raises(DownloadError):
        fetch(dl, 5, tmp_path / "got" / "step_5")
    assert dl.stats["bad_shard"] == 2 and not (tmp_path / "got" / "step_5").exists()


def test_relay_killed_mid_download_fails_over(tmp_path, origin, relays):
    src = make_step(tmp_path / "w", 6)
    origin.publish(6, src)
    relay = relays([origin.url], origin.public_key, "relay")
    relay.wait_step(6)
    dl = downloader(tmp_path, [relay.url, origin.url], origin.public_key, concurrency=1)
    landed = []

    def on_shard(shard):
        landed.append(shard.name)
        if len(landed) == 1:
            relay.kill()  # gone after the first shard: the rest must come from the origin

    async def go():
        m = (await dl.manifest(6))[0]
        await dl.shards(m, dl.work_dir / "v6", on_shard=on_shard)
        return await dl.fetch(6, tmp_path / "got" / "step_6", manifest=m)
    dest = asyncio.run(go())
    assert relay.proc.returncode == -signal.SIGKILL and len(landed) == 5
    assert dl.stats["failed_request"] >= 1 and same_files(src, dest)


def test_partial_download_resumes_with_a_byte_range(tmp_path, origin):
    src = make_step(tmp_path / "w", 8)
    origin.publish(8, src)
    dl = downloader(tmp_path, [origin.url], origin.public_key)
    part = dl.work_dir / "v8" / "shard_00001.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes((origin.store.root / "v8" / "shard_00001.bin").read_bytes()[:40_000])  # an interrupted attempt
    dest = fetch(dl, 8, tmp_path / "got" / "step_8")
    assert same_files(src, dest)
    assert dl.stats["resumed"] == 1
    total = sum(f.stat().st_size for f in (origin.store.root / "v8").glob("shard_*.bin"))
    assert dl.stats["bytes"] == total - 40_000  # the first 40,000 bytes were not fetched again


def test_origin_restart_keeps_serving_and_publishing(tmp_path):
    key = load_or_create_key(tmp_path / "k")
    port = free_port()
    first = Origin(tmp_path / "origin", key, port=port, shard_size=SHARD).start()
    src1 = make_step(tmp_path / "w", 1)
    first.publish(1, src1)
    first.stop()
    again = Origin(tmp_path / "origin", load_or_create_key(tmp_path / "k"), port=port, shard_size=SHARD).start()
    try:
        src2 = make_step(tmp_path / "w", 2)
        again.publish(2, src2)
        dest1 = fetch(downloader(tmp_path, [again.url], public_hex(key)), 1, tmp_path / "got" / "step_1")
        dest2 = fetch(downloader(tmp_path, [again.url], public_hex(key)), 2, tmp_path / "got" / "step_2")
        assert same_files(src1, dest1) and same_files(src2, dest2)
    finally:
        again.stop()


def test_retention_keeps_the_last_steps_on_origin_and_relay(tmp_path, origin, relays):
    origin.keep_last = 2
    relay = relays([origin.url], origin.public_key, "relay")
    for step in (1, 2, 3, 4):
        origin.publish(step, make_step(tmp_path / "w", step))
        relay.wait_step(step)
    assert sorted(parse_distribution((origin.store.root / "distribution.txt").read_text())) == [3, 4]
    assert sorted(p.name for p in origin.store.root.glob("v*")) == ["v3", "v4"]
    relay_steps = sorted(parse_distribution((relay.dir / "distribution.txt").read_text()))
    assert relay_steps[-1] == 4 and len(relay_steps) <= 3


def test_long_poll_answers_when_a_step_is_published(tmp_path, origin):
    origin.publish(1, make_step(tmp_path / "w", 1))

    async def go():
        dl = downloader(tmp_path, [origin.url], origin.public_key)
        waiting = asyncio.create_task(dl.latest(after=1, wait_s=50))
        await asyncio.sleep(0.5)
        assert not waiting.done()  # held open: nothing newer than step 1 yet
        await asyncio.to_thread(origin.publish, 2, make_step(tmp_path / "w", 2))
        latest = await asyncio.wait_for(waiting, 40)  # answered by the publish, not by the 50 s timeout
        await dl.close()
        return latest
    assert asyncio.run(go()) == 2


def test_server_serves_only_the_layout(tmp_path, origin):
    origin.publish(1, make_step(tmp_path / "w", 1))
    (origin.store.root / "secret.key").write_text("x")
    for path in ("secret.key", "../keys/trainer.ed25519", ".staging-1/payload.tar", "v1/shard_00001.bin.part"):
        assert httpx.get(f"{origin.url}/{path}").status_code == 404


# ---------------------------------------------------------------- the real `shardcast` package

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


def test_a_listed_shard_still_arriving_is_served_the_moment_it_lands(tmp_path):
    """How a relay passes shards on before it holds the whole step: the request waits, then gets it."""
    from composer_prime.transports.weights.shardcast.store import ServerThread, Store

    store = Store(tmp_path / "relay")
    server = ServerThread(store, "127.0.0.1", free_port(), "test-relay")
    server.start()
    try:
        (store.root / "v1").mkdir()
        store.write_distribution({1: ("a" * 64, 2)})
        (store.root / "v1" / "shard_00001.bin").write_bytes(b"first")
        store.changed()
        url = f"http://127.0.0.1:{server.port}/v1"
        assert httpx.get(f"{url}/shard_00001.bin").content == b"first"

        async def go():
            async with httpx.AsyncClient(timeout=30) as http:
                pending = asyncio.create_task(http.get(f"{url}/shard_00002.bin"))
                await asyncio.sleep(0.5)
                assert not pending.done()  # listed but not here yet: held open, not refused
                (store.root / "v1" / "shard_00002.bin").write_bytes(b"second")
                store.changed()
                return await pending
        r = asyncio.run(go())
        assert r.status_code == 200 and r.content == b"second"
        assert httpx.get(f"{url}/shard_00003.bin").status_code == 404  # not in the listing: refused at once
    finally:
        server.stop()


# ---------------------------------------------------------------- delta broadcast

def consecutive_steps(root: Path, dtype: torch.dtype) -> tuple[Path, Path]:
    """Two steps one small optimizer update apart (|update| ~ 1e-4 on weights ~ 0.05, as in the quickstart)."""
    torch.manual_seed(0)
    w = torch.randn(200_000) * 0.05
    return (make_step(root, 1, weights=w.to(dtype)),
            make_step(root, 2, weights=(w + 1e-4 * torch.randn_like(w).sign()).to(dtype)))


def test_a_node_holding_the_previous_step_fetches_only_the_delta(tmp_path, origin):
    a, b = consecutive_steps(tmp_path / "w", torch.bfloat16)
    origin.publish(1, a)
    m2 = origin.publish(2, b)
    assert m2.delta is not None and m2.delta.base_step == 1 and m2.delta.stride == 2
    assert m2.delta.size * 3 <= m2.total_size  # every weight moved by 1e-4 here; real trainer steps: see benchmarks/broadcast.py

    dl = downloader(tmp_path, [origin.url], origin.public_key)

    async def go():
        await dl.fetch(1, tmp_path / "got" / "step_1")
        before = dl.stats["bytes"]
        await dl.fetch(2, tmp_path / "got" / "step_2")
        await dl.close()
        return dl.stats["bytes"] - before
    fetched = asyncio.run(go())
    assert dl.stats["delta_steps"] == 1 and fetched == m2.delta.size
    assert same_files(b, tmp_path / "got" / "step_2")


def test_a_chain_of_deltas_stays_exact(tmp_path, origin):
    torch.manual_seed(1)
    w = torch.randn(50_000)
    steps = []
    for step in range(1, 5):
        w = w + 1e-3 * torch.randn_like(w)
        steps.append(make_step(tmp_path / "w", step, weights=w.clone()))
        origin.publish(step, steps[-1])
    dl = downloader(tmp_path, [origin.url], origin.public_key)

    async def go():
        for step in range(2, 5):  # joins at step 2: full, then two deltas, each rebuilt on the last
            await dl.fetch(step, tmp_path / "got" / f"step_{step}")
        await dl.close()
    asyncio.run(go())
    assert dl.stats["delta_steps"] == 2
    assert same_files(steps[-1], tmp_path / "got" / "step_4")


def test_a_corrupt_delta_falls_back_to_the_full_step(tmp_path, origin):
    a, b = consecutive_steps(tmp_path / "w", torch.float32)
    origin.publish(1, a)
    m2 = origin.publish(2, b)
    bad = origin.store.root / "v2" / m2.delta.name
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    dl = downloader(tmp_path, [origin.url], origin.public_key, rounds=1)

    async def go():
        await dl.fetch(1, tmp_path / "got" / "step_1")
        await dl.fetch(2, tmp_path / "got" / "step_2")
        await dl.close()
    asyncio.run(go())
    assert dl.stats["delta_failed"] == 1 and dl.stats["bad_shard"] == 1 and dl.stats["delta_steps"] == 0
    assert same_files(b, tmp_path / "got" / "step_2")


def test_relay_carries_the_delta(tmp_path, origin, relays):
    a, b = consecutive_steps(tmp_path / "w", torch.bfloat16)
    origin.publish(1, a)
    relay = relays([origin.url], origin.public_key, "relay")
    relay.wait_step(1)
    m2 = origin.publish(2, b)
    relay.wait_step(2)
    assert (relay.dir / "v2" / m2.delta.name).read_bytes() == (origin.store.root / "v2" / m2.delta.name).read_bytes()
    dl = downloader(tmp_path, [relay.url], origin.public_key)

    async def go():
        await dl.fetch(1, tmp_path / "got" / "step_1")
        await dl.fetch(2, tmp_path / "got" / "step_2")
        await dl.close()
    asyncio.run(go())
    assert dl.stats["delta_steps"] == 1 and same_files(b, tmp_path / "got" / "step_2")

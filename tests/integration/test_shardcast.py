"""SHARDCAST weight broadcast: layout, signatures, failover, resume, retention, long-poll.
None of these loads unverified weights. Interop with `shardcast` and the delta: sibling modules."""

from __future__ import annotations

import asyncio
import json
import logging
import signal

import httpx
import pytest

from composer_prime.contract.weights import Shardcast
from composer_prime.transports.weights.shardcast.client import DownloadError
from composer_prime.transports.weights.shardcast.follow import follow
from composer_prime.transports.weights.shardcast.manifest import Manifest, load_or_create_key, public_hex, sign
from composer_prime.transports.weights.shardcast.origin import Origin
from composer_prime.transports.weights.shardcast.store import parse_distribution

from tests.conftest import free_port
from tests.support.shardcast_helpers import SHARD, downloader, fetch, make_step, origin, relays, same_files  # noqa: F401


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


def test_a_follower_says_when_no_server_answers_and_when_one_does_again(tmp_path, caplog):
    """A relay's host cut off (test_separate_machines.py cuts one): inference says so once and keeps
    serving, says when a server answers again, and loads the newest step; a server not up yet at the
    start is no outage (nothing said)."""
    key = load_or_create_key(tmp_path / "keys" / "trainer.ed25519")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    served: list[int] = []

    async def load(path: str, step: int) -> None:
        served.append(step)

    async def until(n: int) -> None:
        while len(served) < n:
            await asyncio.sleep(0.1)

    async def go():
        task = asyncio.create_task(follow(Shardcast((url,), public_hex(key)), str(tmp_path / "base"), tmp_path / "inference",
                                          lambda: served[-1] if served else 0, load, wait_s=1.0))
        await asyncio.sleep(1.5)  # nothing listens yet
        server = Origin(tmp_path / "origin", key, port=port, shard_size=SHARD, keep_last=3).start()
        try:
            server.publish(1, make_step(tmp_path / "w", 1))
            await until(1)
            server.stop()  # gone: every poll refused
            await asyncio.sleep(2.5)
            server = Origin(tmp_path / "origin", key, port=port, shard_size=SHARD, keep_last=3).start()
            server.publish(2, make_step(tmp_path / "w", 2))
            await until(2)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            server.stop()

    with caplog.at_level(logging.INFO):
        asyncio.run(asyncio.wait_for(go(), 60))
    said = [r.getMessage() for r in caplog.records if "weight server" in r.getMessage()]
    assert said == [f"no weight server answers ({url}): serving step 1 until one does",
                    f"a weight server answers again ({url}): serving step 1"]
    assert served == [1, 2]

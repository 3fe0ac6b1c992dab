"""Delta broadcast: a node holding the previous step fetches only the compressed XOR to the next."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from composer_prime.transports.weights.shardcast.client import COUNTS
from tests.support.shardcast_helpers import downloader, make_step, origin, relays, same_files  # noqa: F401


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
    assert dict(dl.stats) == dict.fromkeys(COUNTS, 0)  # stats.json names every count, a zero too (none refused here)

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


def test_a_delta_against_a_step_republished_differently_is_refused_once(tmp_path, origin):
    """A trainer restarted from a checkpoint publishes step 1 again with other weights: the node
    holding the first step 1 cannot use step 2's delta, fetches step 2 in full, and step 3's delta
    (against that step 2) works again (the payload rebuilt from the wrong base is not kept)."""
    torch.manual_seed(2)
    w = torch.randn(50_000)
    first = make_step(tmp_path / "old", 1, weights=w.clone())
    steps = [make_step(tmp_path / "w", s, weights=w + s * 1e-3 * torch.randn_like(w)) for s in (1, 2, 3)]
    origin.publish(1, first)
    dl = downloader(tmp_path, [origin.url], origin.public_key)

    async def go():
        await dl.fetch(1, tmp_path / "got" / "step_1")
        for step, path in enumerate(steps, 1):  # the restarted trainer's steps
            origin.publish(step, path)
        for step in (2, 3):
            await dl.fetch(step, tmp_path / "got" / f"step_{step}")
        await dl.close()
    asyncio.run(go())
    assert dl.stats["delta_failed"] == 1 and dl.stats["delta_steps"] == 1
    assert same_files(steps[-1], tmp_path / "got" / "step_3")

"""The volunteer pool's bookkeeping (orchestrator/volunteers.py) without its HTTP server: a lease
answered, a node that dies mid-lease (silent past `dead_after` beats, and not before: its lease fails
at once, it leaves the NodePool), ejection at `eject_after` rejections (its key refused from then on),
the rate limit's bucket."""

import asyncio
import time

import pytest
from fastapi import HTTPException

from composer_prime.config.sampling import SamplingParams
from composer_prime.config.volunteers import VolunteersConfig
from composer_prime.contract.volunteer import Submission
from composer_prime.orchestrator import volunteers
from composer_prime.orchestrator.pool import NodePool
from composer_prime.orchestrator.volunteers import PREFIX, LeaseLost, Member, VolunteerPool


def pool(**cfg) -> VolunteerPool:
    p = VolunteerPool(VolunteersConfig(enabled=True, **cfg), NodePool(["http://trusted"]), "t", {}, "tiny")
    for node in ("aa", "bb"):
        p.members[node] = Member(node, time.time(), tokens=p.cfg.burst, refilled=time.time())
        p.nodes.join(PREFIX + node)
    return p


def test_a_lease_is_answered_by_its_submission():
    async def go():
        p = pool()
        task = asyncio.create_task(p.lease(PREFIX + "aa", [1, 2], SamplingParams(seed=3), 4))
        lease = await p.members["aa"].queue.get()
        assert (lease.prompt_ids, lease.sampling["seed"], lease.weight_version) == ([1, 2], 3, 4)
        sub = Submission("aa", lease.lease_id, 4, lease.prompt_sha256, [5], [-0.1], 3)
        p.pending[lease.lease_id].future.set_result(sub)
        return await task, p
    (lease, sub), p = asyncio.run(go())
    assert sub.lease_id == lease.lease_id and not p.pending and p.members["aa"].counts["leased"] == 1


class Clock:
    """The pool's clock (`time` in orchestrator/volunteers.py), moved by hand: silences are exact."""

    def __init__(self) -> None:
        self.now = 1e9

    def time(self) -> float:
        return self.now


def test_a_node_silent_past_3_beats_is_dead_its_leases_fail_at_once_and_it_leaves_the_node_pool(monkeypatch):
    """`dead_after` (3) beats, the shipped default: silent for 2.5 beat periods a node is alive through
    several sweeps; at 3.5 the next sweep declares it dead and its lease fails at once."""
    clock = Clock()
    monkeypatch.setattr(volunteers, "time", clock)

    async def go():
        p = pool(lease_s=60)
        p.cfg = p.cfg.model_copy(update={"heartbeat_s": 0.01})  # a sweep every 10 ms of real time
        beat = p.cfg.heartbeat_s
        task = asyncio.create_task(p.lease(PREFIX + "aa", [1], SamplingParams(seed=0), 0))
        await asyncio.sleep(0)
        for m in p.members.values():
            m.last_beat = clock.now - 2.5 * beat
        watch = asyncio.create_task(p._watch())
        await asyncio.sleep(5 * beat)  # about 5 sweeps, the pool's clock standing still
        alive = (p.members["aa"].status, task.done())
        p.members["aa"].last_beat = clock.now - 3.5 * beat
        await asyncio.wait({task}, timeout=1)  # the next sweep, 10 ms away (not the lease's 60 s deadline)
        watch.cancel()
        return p, alive, task.exception() if task.done() else "still in flight"
    p, alive, failed = asyncio.run(go())
    assert alive == ("healthy", False)  # 2.5 beats missed: alive, its lease still in flight
    assert isinstance(failed, LeaseLost) and "is dead" in str(failed)
    assert p.members["aa"].status == "dead" and p.members["aa"].counts["reassigned"] == 1
    assert p.members["bb"].status == "healthy"  # 2.5 beats: still alive
    assert sorted(p.nodes.nodes) == ["http://trusted", PREFIX + "bb"] and p.nodes.left[PREFIX + "aa"] == "dead"


def test_eject_after_k_rejections_and_never_before():
    p = pool(eject_after=2)
    p.verdict("aa", "")
    p.verdict("aa", "toploc")
    assert p.is_member("aa") and not p.ejected
    p.verdict("aa", "sampling")
    assert not p.is_member("aa") and p.ejected == {"aa"} and PREFIX + "aa" not in p.nodes.nodes
    assert p.metrics()["volunteers/ejected"] == 1 and p.metrics()["volunteers/aa/rejected:toploc"] == 1
    assert p.members["bb"].status == "healthy"  # the others are untouched


def test_the_rate_limit_is_a_token_bucket():
    p = pool(rate=1e-9, burst=3)
    m = p.members["aa"]
    for _ in range(3):
        p._limit(m)
    with pytest.raises(HTTPException) as e:
        p._limit(m)
    assert e.value.status_code == 429 and m.counts["limited"] == 1

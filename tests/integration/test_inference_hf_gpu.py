"""The inference server's contract tests (token route, log-probs, seeds in a batch, hot reload,
score route) run again with the embedded engine on CUDA: float32, so that the tests' float32
recomputations on the CPU hold to their tolerances, and its decode step replayed as CUDA graphs
(graphs = auto). Skipped, with that reason, on a machine without CUDA."""

import sys

import httpx
import pytest

from tests.conftest import free_port, start_until_ready
from tests.integration.test_inference_hf import (  # noqa: F401 - fixtures and tests collected here again
    prompt,
    server,
    test_a_groups_requests_go_as_one_and_each_gets_its_own_seeds_completion,
    test_hot_reload_changes_outputs_and_bad_weights_are_refused,
    test_logprobs_match_a_recomputation,
    test_openai_chat_route,
    test_stops_on_eos_and_seed_is_reproducible_inside_a_batch,
)
from tests.integration.test_inference_score import (  # noqa: F401
    logits,
    test_bad_requests_are_400_with_the_reason,
    test_positions_follow_the_tokens_after_a_longer_prefix,
    test_scores_match_a_direct_forward,
)
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def hf_inference(tiny_model_dir, tmp_path_factory):
    """Our inference server on the tiny model, on CUDA in float32 with CUDA graphs; yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_until_ready([sys.executable, "-m", "composer_prime.entrypoints.inference", "--model", str(tiny_model_dir),
                              "--engine", "hf", "--device", "cuda", "--dtype", "float32", "--port", str(port),
                              "--output_dir", str(tmp_path_factory.mktemp("inference-cuda"))],
                             lambda: httpx.get(f"{url}/health").status_code == 200)
    yield url
    proc.terminate()
    proc.wait(timeout=30)

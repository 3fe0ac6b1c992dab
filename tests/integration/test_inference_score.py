"""The score route (/inference/v1/score) of the inference server (embedded HF engine), over real HTTP."""

import asyncio

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from composer_prime.contract.inference import Scores
from composer_prime.orchestrator.client import InferenceClient

IDS = [(11 * i) % 300 + 5 for i in range(24)]


@pytest.fixture(scope="module")
def logits(tiny_model_dir):
    """A direct transformers forward: logits(ids)[j] is the distribution predicting ids[j + 1]."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()

    def forward(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0]

    return forward


def score(url: str, ids: list[int], start: int, top_k: int, temperature: float = 1.0) -> Scores:
    client = InferenceClient([url], "tiny")

    async def go() -> Scores:
        try:
            return await client.score(ids, start, top_k, temperature)
        finally:
            await client.close()

    return asyncio.run(go())


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_scores_match_a_direct_forward(hf_inference, logits, temperature):
    start, k = 7, 5
    s = score(hf_inference, IDS, start, k, temperature)
    want = torch.log_softmax(logits(IDS)[start - 1 : -1] / temperature, -1)
    n = len(IDS) - start
    assert len(s.token_logprobs) == len(s.top_ids) == len(s.top_logprobs) == n
    actual = want.gather(-1, torch.tensor(IDS[start:])[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(s.token_logprobs), actual, atol=1e-5)
    top = torch.tensor(s.top_logprobs)
    assert torch.allclose(top, want.gather(-1, torch.tensor(s.top_ids)), atol=1e-5)
    assert torch.allclose(top, want.topk(k, -1).values, atol=1e-5)
    assert [row[0] for row in s.top_ids] == want.argmax(-1).tolist()
    assert all(row == sorted(row, reverse=True) for row in s.top_logprobs)
    assert all(lp <= row[0] + 1e-6 for lp, row in zip(s.token_logprobs, s.top_logprobs))
    assert s.weight_version == httpx.get(f"{hf_inference}/health").json()["weight_version"]


def test_positions_follow_the_tokens_after_a_longer_prefix(hf_inference, logits):
    # Distillation: the teacher sees a longer context (a hint) before the same completion.
    completion = IDS[-8:]
    student, teacher = IDS[:4] + completion, IDS[:10] + [3, 4, 5] + completion
    s = score(hf_inference, student, len(student) - len(completion), 3)
    t = score(hf_inference, teacher, len(teacher) - len(completion), 3)
    assert len(s.token_logprobs) == len(t.token_logprobs) == len(completion)
    want = torch.log_softmax(logits(teacher)[-len(completion) - 1 : -1], -1)
    assert torch.allclose(torch.tensor(t.token_logprobs), want.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1),
                          atol=1e-5)
    assert s.token_logprobs != pytest.approx(t.token_logprobs, abs=1e-4)  # the context did change the distribution


@pytest.mark.parametrize("body, message", [
    ({"token_ids": IDS, "start": 0, "top_k": 3}, "start must be in [1, 24)"),
    ({"token_ids": IDS, "start": len(IDS), "top_k": 3}, "start must be in [1, 24)"),
    ({"token_ids": IDS, "start": 2, "top_k": 0}, "top_k must be >= 1"),
    ({"token_ids": IDS, "start": 2, "top_k": 3, "temperature": 0.0}, "temperature must be > 0"),
    ({"token_ids": IDS * 30, "start": 2, "top_k": 3}, "exceed max_model_len"),
])
def test_bad_requests_are_400_with_the_reason(hf_inference, body, message):
    r = httpx.post(f"{hf_inference}/inference/v1/score", json=body, timeout=60)
    assert r.status_code == 400 and message in r.json()["detail"]

"""Contract tests of the inference server (embedded HF engine) over real HTTP."""

import concurrent.futures
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from composer_prime.transports.weights import filesystem
from composer_prime.utils.chat import encode_chat


@pytest.fixture(scope="module")
def server(hf_inference):
    return hf_inference


@pytest.fixture(scope="module")
def prompt(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return tok, encode_chat(tok, [{"role": "system", "content": "Reverse the letters."}, {"role": "user", "content": "a b c d"}])


def generate(url, ids, **sampling):
    r = httpx.post(f"{url}/inference/v1/generate", json={"token_ids": ids, "sampling_params": sampling}, timeout=60)
    r.raise_for_status()
    return r


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_recomputation(server, prompt, tiny_model_dir, temperature):
    tok, ids = prompt
    body = generate(server, ids, max_tokens=12, temperature=temperature, seed=3, stop_token_ids=[-1]).json()
    choice = body["choices"][0]
    out = choice["token_ids"]
    assert len(out) == 12 and choice["finish_reason"] == "length"
    got = [c["logprob"] for c in choice["logprobs"]["content"]]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids + out])).logits[0, len(ids) - 1 : -1] / temperature
    want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out)[:, None]).squeeze(-1)
    assert got == pytest.approx(want.tolist(), abs=1e-4)
    assert all(lp <= 0 for lp in got)


def test_stops_on_eos_and_seed_is_reproducible_inside_a_batch(server, prompt):
    tok, ids = prompt
    alone = generate(server, ids, max_tokens=16, seed=11).json()["choices"][0]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # same seed, decoded alongside 7 other requests
        futures = [pool.submit(generate, server, ids, max_tokens=16, seed=11 if i == 0 else 100 + i) for i in range(8)]
        together = futures[0].result().json()["choices"][0]
    assert alone["token_ids"] == together["token_ids"]
    if alone["finish_reason"] == "stop":
        assert alone["token_ids"][-1] == tok.eos_token_id


def test_openai_chat_route(server):
    r = httpx.post(f"{server}/v1/chat/completions", json={"model": "tiny", "max_tokens": 8, "logprobs": True,
                   "messages": [{"role": "user", "content": "a b"}]}, timeout=60)
    body = r.json()
    assert r.status_code == 200 and isinstance(body["choices"][0]["message"]["content"], str)
    assert body["usage"]["completion_tokens"] == len(body["choices"][0]["logprobs"]["content"])
    assert r.headers["X-Weight-Version"] == str(body["weight_version"])


def test_hot_reload_changes_outputs_and_bad_weights_are_refused(server, prompt, tiny_model_dir, tmp_path):
    tok, ids = prompt
    greedy = lambda: generate(server, ids, max_tokens=8, temperature=0.0).json()  # noqa: E731
    before = greedy()
    v0 = httpx.get(f"{server}/health").json()["weight_version"]
    state = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    torch.manual_seed(0)
    noisy = {k: v + 0.05 * torch.randn_like(v) for k, v in state.items()}
    step = filesystem.write_step(tmp_path, v0 + 1, noisy, Path(tiny_model_dir), tied=True)
    filesystem.notify_inference([server], step, v0 + 1)
    after = greedy()
    assert after["weight_version"] == v0 + 1
    assert after["choices"][0]["token_ids"] != before["choices"][0]["token_ids"]

    # a truncated shard: refused with 400, and the server keeps serving the last good weights
    bad = filesystem.write_step(tmp_path, v0 + 2, noisy, Path(tiny_model_dir), tied=True)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    r = httpx.post(f"{server}/update_weights", json={"path": str(bad), "version": v0 + 2}, timeout=60)
    assert r.status_code == 400 and "refused" in r.json()["detail"]
    health = httpx.get(f"{server}/health").json()
    assert health["weight_version"] == v0 + 1 and health["failed_updates"] >= 1
    assert greedy()["choices"][0]["token_ids"] == after["choices"][0]["token_ids"]

    original = filesystem.write_step(tmp_path, v0 + 3, state, Path(tiny_model_dir), tied=True)
    filesystem.notify_inference([server], original, v0 + 3)
    assert greedy()["choices"][0]["token_ids"] == before["choices"][0]["token_ids"]


def test_weight_files_round_trip_exactly(tiny_model_dir, tmp_path):
    state = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    step = filesystem.write_step(tmp_path, 7, {**state, "lm_head.weight": state["model.embed_tokens.weight"].clone()},
                                 Path(tiny_model_dir), tied=True)
    back = load_file(str(step / "model.safetensors"))
    assert "lm_head.weight" not in back and set(back) == set(state)
    assert all(torch.equal(back[k], state[k]) for k in state)
    assert (step / filesystem.MARKER).exists() and (step / "config.json").exists() and (step / "tokenizer.json").exists()
    assert filesystem.latest_stable(tmp_path) == (7, step)
    for s in (8, 9, 10):
        filesystem.write_step(tmp_path, s, state, Path(tiny_model_dir), tied=True)
    filesystem.prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_10", "step_9"]


def test_the_llm_hinter_works_against_our_own_server(server, tmp_path):
    """Hints from any OpenAI-compatible endpoint, ours included (the tiny model's hint is noise,
    but it is a real chat completion through the real route)."""
    import asyncio

    from composer_prime.env_runtime.error_sites import ErrorSite
    from composer_prime.orchestrator.hints import HintContext, LLMHinter
    from tool_calc.taskset import CALC_SCHEMA

    async def ask_twice():
        hinter = LLMHinter(server, "tiny", timeout_s=60, cache_path=tmp_path / "hints.jsonl", max_tokens=16)
        ctx = HintContext([], '<tool_call>{"name": "calculator"}</tool_call>', [CALC_SCHEMA])
        site = ErrorSite(0, "unknown_tool", "unknown tool 'calculator'", "calculator")
        hints = [await hinter(site, ctx), await hinter(site, ctx)]
        await hinter.close()
        return hints, hinter

    (first, second), hinter = asyncio.run(ask_twice())
    assert first and first == second and (hinter.calls, hinter.hits, hinter.failures) == (1, 1, 0)


def test_a_groups_requests_go_as_one_and_each_gets_its_own_seeds_completion(server, prompt):
    """Calls made together with one prompt and consecutive seeds are one request for n completions;
    each caller gets exactly what its own request returns."""
    import asyncio

    from composer_prime.config.sampling import SamplingParams
    from composer_prime.orchestrator.client import InferenceClient

    tok, ids = prompt
    other = ids[:-1]
    calls = [(ids, 40 + i) for i in range(8)] + [(ids, 100), (other, 7)]

    async def together():
        client = InferenceClient([server], "tiny")
        try:
            out = await asyncio.gather(*(client.generate(p, SamplingParams(max_tokens=16, seed=s)) for p, s in calls))
            return out, client.requests
        finally:
            await client.close()

    got, requests = asyncio.run(together())
    assert requests == 3  # seeds 40..47 as one, 100 alone, the other prompt alone
    for (p, s), c in zip(calls, got):
        alone = generate(server, p, max_tokens=16, seed=s).json()["choices"][0]
        assert c.token_ids == alone["token_ids"] and c.logprobs == pytest.approx([x["logprob"] for x in alone["logprobs"]["content"]], abs=1e-5)  # batch-size rounding
    assert len({tuple(c.token_ids) for c in got[:8]}) > 1  # eight seeds, not one completion eight times

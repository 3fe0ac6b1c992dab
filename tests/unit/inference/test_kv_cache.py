"""The embedded engine's static KV cache (cache.py) on the tiny model, against forwards with no cache:
prefill (shared prompts, right padding), decode steps at different positions per row, rows moved
by compaction, and whole requests decoded by the continuous batch."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from composer_prime.config.sampling import SamplingParams
from composer_prime.inference.engines.hf.batch import DeviceBatch
from composer_prime.inference.engines.hf.cache import ATTENTION, SlotModel
from composer_prime.inference.engines.hf.scheduler import Request, Scheduler


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    torch.set_num_threads(1)
    ours = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation=ATTENTION).eval()
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return ours, plain


def last_logits(plain, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return plain(torch.tensor([ids])).logits[0, -1]


@torch.no_grad()
def test_prefill_and_decode_equal_a_forward_with_no_cache_after_rows_move(models):
    ours, plain = models
    slots = SlotModel(ours, rows=4, length=64)
    prompts = [[5, 9, 14, 3, 22, 7, 40], [11, 12, 13]]
    logits = slots.head(slots.prefill(prompts, dst=[0, 1, 2], src=[0, 1, 0]))  # rows 0 and 2 continue the same prompt
    for p, row in zip(prompts, logits):
        assert torch.allclose(row, last_logits(plain, p), atol=1e-5)
    seqs = [list(prompts[0]), list(prompts[1]), list(prompts[0])]
    nxt = [30, 31, 32]  # three different continuations, rows at positions 7, 3 and 7
    for step in range(12):
        if step == 6:  # row 1 finished: row 2 takes its place (compaction), row 0 goes on
            slots.move([2], [1], width=len(seqs[2]) + 1)
            seqs, nxt = [seqs[0], seqs[2]], [nxt[0], nxt[2]]
        for s, t in zip(seqs, nxt):
            s.append(t)
        pos = torch.tensor([len(s) - 1 for s in seqs])
        out = slots.head(slots.decode(torch.tensor(nxt), pos, b=len(seqs), w=int(pos.max()) + 1))
        for s, row in zip(seqs, out):
            assert torch.allclose(row, last_logits(plain, s), atol=1e-5), (step, s)
        nxt = out.argmax(-1).tolist()


def test_a_model_whose_logits_are_not_its_head_over_its_decoder_is_refused(models, monkeypatch):
    ours, _ = models
    forward = ours.forward
    monkeypatch.setattr(ours, "forward", lambda *a, **k: type(forward(*a, **k))(logits=forward(*a, **k).logits * 0.5))
    with pytest.raises(NotImplementedError, match="not lm_head"):
        SlotModel(ours, rows=1, length=8)


@torch.no_grad()
def test_a_request_joining_mid_decode_gets_its_tokens_alone_and_log_probs_of_the_model(models):
    ours, plain = models
    scheduler = Scheduler(DeviceBatch(SlotModel(ours, rows=4, length=64), 4, 64))
    got = {}

    def ask(name: str, prompt: list[int], seed: int, max_tokens: int, temperature: float = 1.0) -> None:
        params = SamplingParams(max_tokens=max_tokens, seed=seed, temperature=temperature, stop_token_ids=(-1,))
        scheduler.submit(Request(prompt, params, lambda g: got.__setitem__(name, g)))

    joiner = [4, 8, 15, 16, 23, 42]
    ask("joiner-alone", joiner, 7, 10, 0.8)
    scheduler.drain()
    ask("early", [1, 2, 3], 1, 4)
    ask("long", [9, 9, 9, 9], 2, 20)
    for _ in range(3):
        scheduler.tick()
    ask("joiner", joiner, 7, 10, 0.8)  # joins at position 6 while "long" is at 8 and "early" leaves
    scheduler.drain()
    a, b = got["joiner-alone"], got["joiner"]
    assert a.token_ids == b.token_ids and len(a.token_ids) == 10
    assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)
    logits = plain(torch.tensor([joiner + b.token_ids])).logits[0, len(joiner) - 1: -1] / 0.8
    want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(b.token_ids)[:, None]).squeeze(-1)
    assert b.logprobs == pytest.approx(want.tolist(), abs=1e-5)


@torch.no_grad()
def test_kept_states_are_the_hidden_states_of_a_prefill_over_prompt_and_completion(models):
    """What a volunteer proves (verify/toploc.py) is kept while decoding: each token's state is the one
    that gave its logits, through rows moving (the short request leaves first, the last moves up)."""
    ours, _ = models
    slots = SlotModel(ours, rows=4, length=64)
    scheduler = Scheduler(DeviceBatch(slots, 4, 64, keep_states=True))
    reqs, got = {}, {}
    for name, prompt, n in [("short", [1, 2, 3], 3), ("long", [9, 8, 7, 6], 14), ("mid", [4, 8, 15], 9)]:
        params = SamplingParams(max_tokens=n, seed=len(reqs), stop_token_ids=(-1,))
        reqs[name] = Request(prompt, params, lambda g, name=name: got.__setitem__(name, g))
        scheduler.submit(reqs[name])
        scheduler.tick()  # each joins at a different step
    scheduler.drain()
    for name, r in reqs.items():
        ids = got[name].token_ids
        want, _ = slots.states(r.prompt + ids, len(r.prompt))  # one forward, no cache
        assert r.states.dtype == torch.bfloat16 and r.states.shape == (len(ids), ours.config.hidden_size)
        assert torch.allclose(r.states.float(), want.to(torch.bfloat16).float(), atol=2e-2, rtol=1e-2), name

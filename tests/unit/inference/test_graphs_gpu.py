"""The embedded engine on CUDA: the sampler's streams equal the CPU's bit for bit, the KV cache
equals forwards with no cache, the decode step replayed as CUDA graphs equals the step run op by
op, and a weight swap reaches the recorded graphs (the compiled variants, which start compiler
processes: tests/integration/test_inference_compile.py). Skipped, with that reason, on a machine
without CUDA."""

import asyncio
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from composer_prime.config.sampling import SamplingParams
from composer_prime.inference.engines.hf.batch import DeviceBatch
from composer_prime.inference.engines.hf.cache import SlotModel
from composer_prime.inference.engines.hf.engine import HFEngine
from composer_prime.model.sampling import stream_keys, uniforms
from composer_prime.inference.engines.hf.scheduler import Request, Scheduler
from tests.support.hf_batches import BUDGETS, LENGTH, load, run

pytestmark = pytest.mark.gpu


def test_uniforms_on_cuda_equal_the_cpu_bit_for_bit():
    keys, counters = stream_keys([0, 1, 2**63 + 9, -4]), torch.arange(4) * 1000
    assert uniforms(keys.cuda(), counters.cuda()).cpu().tolist() == uniforms(keys, counters).tolist()


@torch.no_grad()
def test_kv_cache_on_cuda_equals_a_forward_with_no_cache(tiny_model_dir):
    model = load(tiny_model_dir, torch.float32, "cuda")
    slots = SlotModel(model, rows=2, length=32)
    seqs = [[5, 9, 14, 3, 22], [11, 12]]
    logits = slots.head(slots.prefill(seqs, dst=[0, 1], src=[0, 1]))
    for step in range(6):
        nxt = logits.argmax(-1).tolist()
        for s, t in zip(seqs, nxt):
            s.append(t)
        pos = torch.tensor([len(s) - 1 for s in seqs], device="cuda")
        logits = slots.head(slots.decode(torch.tensor(nxt, device="cuda"), pos, b=2, w=int(pos.max()) + 1))
        for s, row in zip(seqs, logits):
            assert torch.allclose(row, model(torch.tensor([s], device="cuda")).logits[0, -1], atol=1e-4), step


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_graph_path_equals_the_eager_path(tiny_model_dir, dtype):
    model = load(tiny_model_dir, dtype, "cuda")
    eager, graphed = run(model, bucketed=True), run(model, "capture")
    assert graphed == eager  # the same kernels on the same shapes: bit for bit
    assert len(eager) == 9 and {len(t) for t, _ in eager.values()} == BUDGETS
    if dtype == torch.float32:  # against exact shapes (no bucketing) only float noise may differ
        exact = run(model)
        assert all(exact[i][0] == eager[i][0] for i in exact)
        assert all(exact[i][1] == pytest.approx(eager[i][1], abs=1e-4) for i in exact)


def test_a_weight_swap_reaches_the_recorded_graphs(tiny_model_dir, tmp_path):
    state = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    torch.manual_seed(0)
    noisy = {k: v + 0.05 * torch.randn_like(v) for k, v in state.items()}
    (tmp_path / "noisy").mkdir()
    save_file(noisy, str(tmp_path / "noisy" / "model.safetensors"))
    greedy = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(-1,))

    async def swap() -> tuple[list[int], list[int]]:
        engine = HFEngine(str(tiny_model_dir), "tiny", max_model_len=LENGTH, device="cuda", dtype="float32",
                          graphs="capture")
        await engine.start()
        try:
            before = (await engine.generate([5, 6, 7], greedy)).token_ids  # records the graphs it uses
            await engine.load_weights(str(tmp_path / "noisy"))
            return before, (await engine.generate([5, 6, 7], greedy)).token_ids
        finally:
            await engine.stop()

    before, after = asyncio.run(swap())
    model = load(tiny_model_dir, torch.float32, "cuda")
    model.load_state_dict(noisy, strict=False)
    assert after == run_one(model, [5, 6, 7], greedy) and after != before


def run_one(model, prompt: list[int], params: SamplingParams) -> list[int]:
    batch = DeviceBatch(SlotModel(model, 1, LENGTH), 1, LENGTH, "cuda")
    scheduler, got = Scheduler(batch), []
    with torch.no_grad():
        scheduler.submit(Request(prompt, params, got.append))
        scheduler.drain()
    return got[0].token_ids

"""The embedded engine's attention on the memory layouts CUDA's kernels hand it (issue 35): q, k and v
transposed and strided as projections and rotary leave them, and an SDPA whose (b, heads, q, dim)
output lies in memory as (b, q, heads, dim), as SDPA's efficient and flash kernels return it. On the
CPU every one of these tensors comes out contiguous, so the GPU path's layouts are made here: a
stand-in SDPA that calls torch's own and returns the same values re-strided, and an attention
wrapper that re-strides q, k and v before the engine's own `slot_attention` (and the cache written
from re-strided keys and values). Values are identical to the contiguous layout's, so the results
must be too: `slot_attention` alone, the SlotModel's decode step and the continuous batch over the
tiny model; grouped-query (SmolLM2's 9 query heads over 3 key/value heads, the tiny model's 4 over
2) and plain multi-head; float32 and bfloat16; op by op (bit for bit) and compiled with
`torch.compile(dynamic=True)`. The compiled cases use the `eager` backend: Dynamo traces the step
over fake tensors carrying these strides, which is where a bad view fails when compiled ("Cannot
view a tensor with shape ..."); Inductor would start compiler processes, which this tier forbids,
so its run over these layouts is tests/integration/test_inference_compile.py's."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoModelForCausalLM, LlamaConfig

from composer_prime.config.sampling import SamplingParams
from composer_prime.inference.engines.hf.batch import DeviceBatch
from composer_prime.inference.engines.hf.cache import ATTENTION, SlotCache, SlotModel, slot_attention
from composer_prime.inference.engines.hf.graphs import bucket
from composer_prime.inference.engines.hf.scheduler import Request, Scheduler
from tests.support.hf_batches import load

REAL_SDPA = F.scaled_dot_product_attention
HEADS = {"gqa-9-over-3": (9, 3), "mha-4": (4, 4)}  # (query heads, key/value heads)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def transposed(x: torch.Tensor) -> torch.Tensor:
    """(b, heads, s, dim) laid out as (b, s, heads, dim): a projection's output after `.transpose(1, 2)`."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def heads_major(x: torch.Tensor) -> torch.Tensor:
    """(b, heads, s, dim) laid out as (heads, b, s, dim)."""
    return x.transpose(0, 1).contiguous().transpose(0, 1)


def strided(x: torch.Tensor) -> torch.Tensor:
    """Every other head of a wider, transposed buffer, one position in: strides of no packed layout
    and a storage offset (the head dim's stride stays 1, as every CUDA kernel here leaves it)."""
    b, h, s, d = x.shape
    view = torch.zeros(b, s + 1, 2 * h, d, dtype=x.dtype).transpose(1, 2)[:, ::2, 1:]
    return view.copy_(x)


LAYOUTS = {"transposed": transposed, "heads-major": heads_major, "strided": strided}


def cuda_sdpa(*args, **kwargs) -> torch.Tensor:
    """torch's SDPA, its output re-strided as CUDA's efficient and flash kernels return it."""
    return transposed(REAL_SDPA(*args, **kwargs))


def restrided_attention(module, query, key, value, attention_mask, **kwargs):
    """The engine's attention, handed q, k and v (the cache's slices) in three other layouts."""
    return slot_attention(module, strided(query), transposed(key), heads_major(value), attention_mask, **kwargs)


def use_cuda_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Until `monkeypatch` undoes it: every SDPA call (ours and transformers') answers in CUDA's layout,
    the model's attention re-strides q, k and v, and the cache is written from re-strided keys and
    values (also tests/integration/test_inference_compile.py)."""
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", cuda_sdpa)
    monkeypatch.setitem(AttentionInterface._global_mapping, ATTENTION, restrided_attention)
    update = SlotCache.update

    def restrided_update(self, key_states, value_states, *args, **kwargs):
        return update(self, transposed(key_states), strided(value_states), *args, **kwargs)

    monkeypatch.setattr(SlotCache, "update", restrided_update)


@pytest.fixture
def cuda_layouts(monkeypatch):
    use_cuda_layouts(monkeypatch)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch.set_num_threads(1)
    torch._dynamo.reset()  # every compile here starts from nothing (and none hits the recompile limit)
    yield
    torch._dynamo.reset()


def compiled(fn):
    return torch.compile(fn, dynamic=True, backend="eager")


def decode_inputs(heads: int, kv_heads: int, dtype: torch.dtype, dim: int = 8):
    """One decode step's (query, keys, values, mask) for 3 rows at positions 2, 9 and 5: keys and values
    are slices of a larger cache, as SlotCache.update returns them."""
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    pos = torch.tensor([2, 9, 5])
    w = int(pos.max()) + 1
    query = torch.randn(3, heads, 1, dim, generator=g).to(dtype)
    keys, values = (torch.randn(4, kv_heads, 16, dim, generator=g).to(dtype) for _ in range(2))
    mask = (torch.arange(w)[None, :] <= pos[:, None])[:, None, None, :]
    return query, keys[:3, :, :w], values[:3, :, :w], mask


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
@torch.no_grad()
def test_slot_attention_gives_the_contiguous_layouts_result_on_cudas_layouts(heads, dtype, monkeypatch):
    query, key, value, mask = decode_inputs(*heads, dtype)
    want, _ = slot_attention(None, query.contiguous(), key.contiguous(), value.contiguous(), mask, scaling=0.3)
    g = heads[0] // heads[1]  # the reference itself, against attention over repeated key/value heads
    repeated = REAL_SDPA(query, key.repeat_interleave(g, 1), value.repeat_interleave(g, 1), attn_mask=mask, scale=0.3)
    assert want.shape == (3, 1, heads[0], 8)
    assert torch.allclose(want.float(), repeated.transpose(1, 2).float(), atol=1e-6 if dtype == torch.float32 else 1e-2)
    outputs = []
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **kw: outputs.append(REAL_SDPA(*a, **kw)) or outputs[-1])
    same, _ = slot_attention(None, query, key, value, mask, scaling=0.3)
    assert same.data_ptr() == outputs[0].data_ptr()  # where the layout allows a view, SDPA's output is not copied
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", cuda_sdpa)
    for name, q_layout in LAYOUTS.items():
        for kv_name, kv_layout in LAYOUTS.items():
            got, _ = slot_attention(None, q_layout(query), kv_layout(key), kv_layout(value), mask, scaling=0.3)
            assert torch.equal(got, want), (name, kv_name)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@torch.no_grad()
def test_slot_attention_compiled_gives_the_same_on_cudas_layouts(dtype, monkeypatch):
    query, key, value, mask = decode_inputs(9, 3, dtype)
    want, _ = slot_attention(None, query, key, value, mask, scaling=0.3)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", cuda_sdpa)
    attend = compiled(slot_attention)
    for layout in (transposed, strided):
        got, _ = attend(None, layout(query), transposed(key), strided(value), mask, scaling=0.3)
        assert torch.allclose(got.float(), want.float(), atol=1e-6, rtol=1e-5 if dtype == torch.float32 else 1e-2)


def small_llama(heads: int, kv_heads: int, dtype: torch.dtype, layers: int = 2):
    """A random Llama (SmolLM2's architecture) with head dim 8, on our attention."""
    config = LlamaConfig(vocab_size=96, hidden_size=8 * heads, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=8,
                         max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION, dtype=dtype).eval()


def decoded(model, compile_step: bool = False) -> list[torch.Tensor]:
    """Logits of a prefill (two prompts into three rows) and six decode steps, rows at different positions."""
    slots = SlotModel(model, rows=4, length=32)
    step = compiled(slots.decode) if compile_step else slots.decode
    logits = [slots.head(slots.prefill([[5, 9, 14, 3, 22, 7], [11, 12, 13]], dst=[0, 1, 2], src=[0, 1, 0]))]
    tokens, pos = logits[0].argmax(-1)[[0, 1, 0]], torch.tensor([6, 3, 6])
    for _ in range(6):
        tokens = (tokens + torch.arange(3)) % 96  # + the row: rows 0 and 2 (one prompt) go different ways
        logits.append(slots.head(step(tokens, pos, 3, int(pos.max()) + 1)))
        tokens, pos = logits[-1].argmax(-1), pos + 1
    return logits


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
@torch.no_grad()
def test_the_decode_step_gives_the_contiguous_layouts_logits_on_cudas_layouts(heads, dtype, request):
    model = small_llama(*heads, dtype)
    want = decoded(model)
    request.getfixturevalue("cuda_layouts")
    got = decoded(model)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@torch.no_grad()
def test_the_decode_step_compiled_gives_the_same_logits_on_cudas_layouts(request):
    model = small_llama(9, 3, torch.float32, layers=1)  # one layer: Dynamo traces each, and this tier is kept fast
    want = decoded(model)
    request.getfixturevalue("cuda_layouts")
    got = decoded(model, compile_step=True)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-5) for a, b in zip(got, want))


def generations(model, compile_step: bool = False) -> dict[str, tuple[list[int], list[float]]]:
    """Four requests through the continuous batch, two joining mid-decode (rows move as others leave)."""
    batch = DeviceBatch(SlotModel(model, 4, 64), 4, 64)
    scheduler = (Scheduler(batch, compiled(batch.decode_step), lambda n, w: bucket(n, w, 4, 64)) if compile_step
                 else Scheduler(batch))
    got = {}

    def ask(name: str, prompt: list[int], n: int, seed: int, top_p: float = 1.0) -> None:
        params = SamplingParams(max_tokens=n, seed=seed, temperature=0.8, top_p=top_p, stop_token_ids=(-1,))
        scheduler.submit(Request(prompt, params, lambda g: got.__setitem__(name, g)))

    ask("short", [1, 2, 3], 4, 1)
    ask("long", [9, 9, 9, 9, 9], 14, 2, top_p=0.9)
    for _ in range(3):
        scheduler.tick()
    ask("joiner", [4, 8, 15, 16, 23, 42], 8, 3)
    ask("late", [7, 7], 5, 4)
    scheduler.drain()
    failed = {name: g for name, g in got.items() if isinstance(g, BaseException)}  # the scheduler answers a failed step
    assert len(got) == 4 and not failed, failed
    return {name: (g.token_ids, g.logprobs) for name, g in got.items()}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return {name: load(tiny_model_dir, dtype, "cpu") for name, dtype in DTYPES.items()}


@pytest.mark.parametrize("dtype", DTYPES.keys())
@torch.no_grad()
def test_the_continuous_batch_decodes_the_same_tokens_and_log_probs_on_cudas_layouts(tiny, dtype, request):
    want = generations(tiny[dtype])
    request.getfixturevalue("cuda_layouts")
    assert generations(tiny[dtype]) == want


@torch.no_grad()
def test_the_continuous_batch_compiled_decodes_the_same_on_cudas_layouts(tiny, request):
    want = generations(tiny["float32"])
    request.getfixturevalue("cuda_layouts")
    got = generations(tiny["float32"], compile_step=True)
    assert {k: t for k, (t, _) in got.items()} == {k: t for k, (t, _) in want.items()}
    assert all(got[k][1] == pytest.approx(want[k][1], abs=1e-5) for k in want)

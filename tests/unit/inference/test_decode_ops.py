"""The operations one decode step of the embedded engine launches, pinned (issue 35 part 5): at
SmolLM2-135M's shape a step is launch-bound, not memory- or compute-bound (benchmarks/README.md,
real_model's bound), so an op added to the step costs every token. Counted as the decode benchmark
counts them (`ops_per_step`: benchmarks/support/floors.py, the non-view aten ops on the CPU) over
`DeviceBatch.decode_step`: the model's step and the sampler. A change that adds or removes ops fails
here, and its new count goes here and in benchmarks/README.md (real_model) with the reason. Before
issue 35's part 5: 73 + 46 per layer, the tiny model 305; the attention mask is now additive and made
once per step, where SDPA turned a boolean one into that in every layer (3 ops a layer).

And a scheduler step (`Scheduler.tick`: the decode step and the retiring after it) reads the device
once, the finished rows' flags (`DeviceBatch.finished`): any other read (a `.item()`, `.tolist()`,
`.cpu()`, `bool(t)`, `nonzero`'s size) would stall the host at every token. Two views, as neither sees
all: the aten ops dispatched (`nonzero`, `item`), and the Tensor methods called from Python, where the
reads that dispatch no aten op on the CPU (`tolist`, `cpu`, `numpy`) show (issue 42 part 3 item 2)."""

import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, LlamaConfig

from benchmarks.support.floors import ops_per_call
from composer_prime.config.sampling import SamplingParams
from composer_prime.inference.engines.hf.batch import DeviceBatch
from composer_prime.inference.engines.hf.cache import ATTENTION, SlotModel
from composer_prime.inference.engines.hf.scheduler import Request, Scheduler
from tests.support.hf_batches import load

# measured 2026-11-27 (torch 2.13 CPU, transformers of uv.lock)
LLAMA_BASE, LLAMA_PER_LAYER = 74, 43  # SmolLM2's architecture: embedding, mask, final norm, head and the sampler; each layer
TOP_P = 11  # what the nucleus mask adds to a step
TINY = 294  # the tiny model (Qwen3: 4 layers with q and k norms)
# ops that copy a value to the host, so wait for the device
SYNCS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default", "aten.is_nonzero.default"}
# Tensor methods that hand a tensor's values to Python (on a GPU, each waits for the device), and those that
# move a tensor between devices (`to` only where it names a device)
READS = {"tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "__complex__",
         "__array__", "__repr__", "__format__"}
MOVES = {"to", "cpu", "cuda", "copy_", "pin_memory"}


class Record(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


class Calls(TorchFunctionMode):
    """The Tensor methods and torch functions called from Python, each as (its name, the function that
    called it): a read shows here whether or not it dispatches an aten op."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name != "to" or "device" in kwargs or any(isinstance(a, (str, torch.device, torch.Tensor)) for a in args[1:]):
            self.calls.append((name, sys._getframe(1).f_code.co_name))
        return func(*args, **kwargs)

    def of(self, names: set[str]) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] in names]


def admitted(model, top_p: bool = False) -> DeviceBatch:
    batch = DeviceBatch(SlotModel(model, 4, 64), 4, 64)
    with torch.no_grad():
        batch.admit(0, [([3] * 8, SamplingParams(max_tokens=4, top_p=0.9 if top_p else 1.0), 0)], top_p)
    return batch


def ops(model, top_p: bool = False) -> int:
    batch = admitted(model, top_p)
    with torch.no_grad():
        return ops_per_call(lambda: batch.decode_step(1, 9, top_p), "cpu")


def smollm2_shape(layers: int):
    """SmolLM2-135M's heads (9 query, 3 key/value, 64 wide), `layers` of them; the op count needs no more."""
    config = LlamaConfig(vocab_size=96, hidden_size=576, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION).eval()


@pytest.mark.parametrize("layers", [1, 2])
def test_a_decode_step_at_smollm2s_shape_launches_a_pinned_number_of_ops(layers):
    assert ops(smollm2_shape(layers)) == LLAMA_BASE + LLAMA_PER_LAYER * layers  # SmolLM2's 30 layers: 1364


def test_top_p_adds_a_pinned_number_of_ops():
    assert ops(smollm2_shape(2), top_p=True) - ops(smollm2_shape(2)) == TOP_P


def test_the_tiny_models_decode_step_launches_a_pinned_number_of_ops(tiny_model_dir):
    assert ops(load(tiny_model_dir, torch.float32, "cpu")) == TINY


@pytest.mark.parametrize("top_p", [False, True])
def test_a_scheduler_step_reads_the_device_once_the_finished_flags(top_p):
    batch = DeviceBatch(SlotModel(smollm2_shape(1), 4, 64), 4, 64)
    scheduler, replies = Scheduler(batch), []
    scheduler.submit(Request([3] * 8, SamplingParams(max_tokens=4, top_p=0.9 if top_p else 1.0), replies.append))
    with torch.no_grad():
        scheduler.tick()  # admits, draws the first token and decodes the second
        with Record() as record, Calls() as calls:
            scheduler.tick()  # the third: the request goes on, so nothing but the flags is read
    assert (scheduler.steps, len(scheduler.live), replies) == (2, 1, [])
    assert len(record.names) > 100 and not SYNCS & set(record.names), SYNCS & set(record.names)
    assert calls.of(READS) == [("tolist", "finished")]
    # transformers' rotary embedding moves its inv_freq to the input's device, where it already is
    assert calls.of(MOVES) == [("to", "forward")]


def test_the_read_checks_see_each_way_of_reading_the_device():
    batch = admitted(smollm2_shape(1))
    with Record() as record, Calls() as calls:
        batch.done[:1].nonzero()
        batch.counters[0].item()
        assert True not in batch.done[:1].tolist() and not bool(batch.done[0])
        batch.counters[:1].cpu().numpy(), int(batch.counters[0]), float(batch.temps[0])
        batch.counters.to("cpu"), batch.temps.to(batch.temps), batch.temps.to(torch.float64)
    assert {"aten.nonzero.default", "aten._local_scalar_dense.default"} <= set(record.names)
    assert [name for name, _ in calls.of(READS)] == ["item", "tolist", "__bool__", "cpu", "numpy", "__int__", "__float__"]
    assert [name for name, _ in calls.of(MOVES)] == ["cpu", "to", "to"]  # the dtype's `to` moves nothing

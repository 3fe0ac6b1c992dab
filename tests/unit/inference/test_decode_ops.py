"""The operations one decode step of the embedded engine launches, pinned (issue 35 part 5): at
SmolLM2-135M's shape a step is launch-bound, not memory- or compute-bound (benchmarks/README.md,
real_model's bound), so an op added to the step costs every token. Counted as the decode benchmark
counts them (`ops_per_step`: benchmarks/support/floors.py, the non-view aten ops on the CPU) over
`DeviceBatch.decode_step`: the model's step and the sampler. A change that adds or removes ops fails
here, and its new count goes here and in benchmarks/README.md (real_model) with the reason. Before
issue 35's part 5: 73 + 46 per layer, the tiny model 305; the attention mask is now additive and made
once per step, where SDPA turned a boolean one into that in every layer (3 ops a layer).

And the step reads nothing back from the device: an op that must (a `.item()`, `nonzero`'s size) would
stall the host at every token, where the scheduler's one read per step is the finished rows' flags."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, LlamaConfig

from benchmarks.support.floors import ops_per_call
from composer_prime.config.sampling import SamplingParams
from composer_prime.inference.engines.hf.batch import DeviceBatch
from composer_prime.inference.engines.hf.cache import ATTENTION, SlotModel
from tests.support.hf_batches import load

# measured 2026-11-27 (torch 2.13 CPU, transformers of uv.lock)
LLAMA_BASE, LLAMA_PER_LAYER = 74, 43  # SmolLM2's architecture: embedding, mask, final norm, head and the sampler; each layer
TOP_P = 11  # what the nucleus mask adds to a step
TINY = 294  # the tiny model (Qwen3: 4 layers with q and k norms)
# ops that copy a value to the host, so wait for the device
SYNCS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default", "aten.is_nonzero.default"}


class Record(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


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
def test_a_decode_step_reads_nothing_back_from_the_device(top_p):
    batch = admitted(smollm2_shape(1), top_p)
    with torch.no_grad(), Record() as record:
        batch.decode_step(1, 9, top_p)
    assert len(record.names) > 100 and not SYNCS & set(record.names), SYNCS & set(record.names)
    with Record() as record:  # what the step must not do, seen by the same check
        batch.done[:1].nonzero()
        batch.counters[0].item()
    assert {"aten.nonzero.default", "aten._local_scalar_dense.default"} <= set(record.names)

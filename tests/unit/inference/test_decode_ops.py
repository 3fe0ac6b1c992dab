"""The operations one decode step of the embedded engine launches, pinned (issue 35 part 5): at
SmolLM2-135M's shape a step is launch-bound, not memory- or compute-bound (benchmarks/README.md,
real_model's bound), so an op added to the step costs every token. Counted as the decode benchmark
counts them (`ops_per_step`: benchmarks/support/floors.py, the non-view aten ops on the CPU) over
`DeviceBatch.decode_step`: the model's step and the sampler. A change that adds or removes ops fails
here, and its new count goes here and in benchmarks/README.md (real_model) with the reason."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from benchmarks.support.floors import ops_per_call
from composer_prime.config.sampling import SamplingParams
from composer_prime.inference.engines.hf.batch import DeviceBatch
from composer_prime.inference.engines.hf.cache import ATTENTION, SlotModel
from tests.support.hf_batches import load

# measured 2026-11-27 (torch 2.13 CPU, transformers of uv.lock)
LLAMA_BASE, LLAMA_PER_LAYER = 73, 46  # SmolLM2's architecture: embedding, final norm, head and the sampler; each layer
TOP_P = 11  # what the nucleus mask adds to a step
TINY = 305  # the tiny model (Qwen3: 4 layers with q and k norms)


def ops(model, top_p: bool = False) -> int:
    batch = DeviceBatch(SlotModel(model, 4, 64), 4, 64)
    with torch.no_grad():
        batch.admit(0, [([3] * 8, SamplingParams(max_tokens=4, top_p=0.9 if top_p else 1.0), 0)], top_p)
        return ops_per_call(lambda: batch.decode_step(1, 9, top_p), "cpu")


def smollm2_shape(layers: int):
    """SmolLM2-135M's heads (9 query, 3 key/value, 64 wide), `layers` of them; the op count needs no more."""
    config = LlamaConfig(vocab_size=96, hidden_size=576, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION).eval()


@pytest.mark.parametrize("layers", [1, 2])
def test_a_decode_step_at_smollm2s_shape_launches_a_pinned_number_of_ops(layers):
    assert ops(smollm2_shape(layers)) == LLAMA_BASE + LLAMA_PER_LAYER * layers  # SmolLM2's 30 layers: 1453


def test_top_p_adds_a_pinned_number_of_ops():
    assert ops(smollm2_shape(2), top_p=True) - ops(smollm2_shape(2)) == TOP_P


def test_the_tiny_models_decode_step_launches_a_pinned_number_of_ops(tiny_model_dir):
    assert ops(load(tiny_model_dir, torch.float32, "cpu")) == TINY

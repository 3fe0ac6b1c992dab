"""Copies of the model for audits (inference/engines/hf/copies.py): a copy in bfloat16 measures
exactly what a model loaded in bfloat16 does, a step's tensors replace the base model's (a step
whose tensors do not match is refused), and only the last `keep` copies stay loaded."""

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from composer_prime.inference.engines.hf.cache import ATTENTION, SlotModel
from composer_prime.inference.engines.hf.copies import Copies

IDS = [(5 * i) % 200 + 3 for i in range(24)]


def prefill(model_dir, dtype, state=None):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=ATTENTION).eval()
    if state is not None:
        model.load_state_dict(state, strict=False)
    with torch.no_grad():
        return SlotModel(model, 1, 64).states(IDS, 10)


def test_a_copy_measures_what_its_dtype_and_weights_give_and_only_the_last_two_stay(tiny_model_dir, tmp_path):
    copies = Copies(str(tiny_model_dir), "cpu", 64)
    hidden, logits = copies.states(IDS, 10, str(tiny_model_dir), "bfloat16")
    want_h, want_l = prefill(tiny_model_dir, torch.bfloat16)
    assert hidden.dtype == torch.bfloat16 and logits.dtype == torch.float32 and hidden.shape[0] == len(IDS) - 10
    assert torch.equal(hidden, want_h) and torch.equal(logits, want_l.float())
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    step = {k: v + 0.01 for k, v in base.items() if k != "lm_head.weight"}
    (tmp_path / "step").mkdir()
    save_file(step, str(tmp_path / "step" / "model.safetensors"))
    _, stepped = copies.states(IDS, 10, str(tmp_path / "step"), "float32")
    assert torch.equal(stepped, prefill(tiny_model_dir, torch.float32, step)[1].float())
    assert not torch.equal(stepped, prefill(tiny_model_dir, torch.float32)[1].float())
    copies.states(IDS, 10, str(tiny_model_dir), "float32")
    assert [k[1] for k in copies._copies] == ["float32", "float32"]  # the bfloat16 copy, the oldest, is gone
    (tmp_path / "bad").mkdir()
    save_file({"nosuch.weight": torch.zeros(2)}, str(tmp_path / "bad" / "model.safetensors"))
    with pytest.raises(ValueError, match="do not match"):
        copies.states(IDS, 10, str(tmp_path / "bad"), "float32")

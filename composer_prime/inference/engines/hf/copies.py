"""Copies of a model holding given weights in a given dtype, for audits: one prefill of a
volunteer's prompt + completion under the weights it claims, in the dtype the run audits in
(config/volunteers.py), whatever the engine serves. The embedded engine uses one for an older
version or another dtype than its own; vLLM, which exposes no hidden states, for every audit.

Each copy is the embedded engine's own model code (a `SlotModel` of batch 1), loaded from the base
model and then the step's tensors, checked by name and shape (`read_step`, also how the embedded
engine checks a step before swapping it in). The last `keep` copies asked for are kept: audits of
two versions in flight (async level 2) do not reload one each time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from composer_prime.inference.engines.hf.cache import ATTENTION, SlotModel


def read_step(path: str, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A step's tensors, checked against `model`'s names and shapes (ValueError if not)."""
    file = Path(path) / "model.safetensors"
    state = load_file(str(file))  # raises on a missing or corrupt file
    own = model.state_dict()
    tied = model.config.tie_word_embeddings
    missing = set(own) - set(state) - ({"lm_head.weight"} if tied else set())
    if missing or any(state[k].shape != own[k].shape for k in state if k in own) or set(state) - set(own):
        raise ValueError(f"{file}: tensors do not match the served model (missing {sorted(missing)[:3]})")
    return state


class Copies:
    def __init__(self, model_path: str, device: str, max_model_len: int, keep: int = 2) -> None:
        self.model_path, self.device, self.max_model_len, self.keep = model_path, device, max_model_len, keep
        self._copies: OrderedDict[tuple[str, str], SlotModel] = OrderedDict()  # (weights, dtype) -> a copy
        self._lock = threading.Lock()

    @torch.no_grad()
    def states(self, token_ids: list[int], start: int, weights: str, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states and float32 logits predicting token_ids[start:] (on the CPU), under `weights` (a
        step directory, or the base model's) in `dtype`. Blocking: call it from a thread."""
        copy = self._get(weights, dtype)
        if not all(0 <= t < copy.model.config.vocab_size for t in token_ids):
            raise ValueError(f"every token id must be in [0, {copy.model.config.vocab_size})")
        hidden, logits = copy.states(token_ids, start)
        return hidden.cpu(), logits.float().cpu()

    def _get(self, weights: str, dtype: str) -> SlotModel:
        with self._lock:
            key = (str(Path(weights).resolve()), dtype)
            if key not in self._copies:
                while len(self._copies) >= self.keep:  # the oldest is freed before the new one loads
                    self._copies.popitem(last=False)
                model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, dtype),
                                                             attn_implementation=ATTENTION)
                if key[0] != str(Path(self.model_path).resolve()):  # a step: the base model's own weights need no load
                    model.load_state_dict(read_step(weights, model), strict=False)  # checked: only a tied head is absent
                self._copies[key] = SlotModel(model.to(self.device).eval(), 1, self.max_model_len)
            self._copies.move_to_end(key)
            return self._copies[key]

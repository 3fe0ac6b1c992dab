"""`SeededDraws`: a vLLM logits processor (vLLM's own extension point, `--logits-processors`) that
makes vLLM draw each token with the run's seeded sampler (model/sampling.py), so a vLLM worker's
draws replay on the validator exactly as the embedded engine's do.

For every request with a seed, token i is `sample(logits, T, top_p, key(seed), i)` over vLLM's
float32 logits, the inverse-CDF draw at the uniform u(seed, i); every other logit is set to -inf,
so whatever vLLM's sampler does next (temperature, top-p, its own random draw) it takes that
token. vLLM's log-probs of the result are those of a one-hot (0): the worker takes them from its
prefill instead (volunteer/engines.py). Loaded in vLLM's process only (it imports vLLM).
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from composer_prime.model.sampling import sample, stream_keys


class SeededDraws(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        # batch row -> (stream key, temperature, top-p, the request's output ids: a live list, its length
        # is the index of the token being drawn)
        self.rows: dict[int, tuple[int, float, float, list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the token, greedy rows included (their draw is the argmax)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, lambda params, _, out: None if params.seed is None else (
            int(stream_keys([params.seed])[0]), params.temperature, params.top_p, out))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        rows = list(self.rows)
        keys, temps, top_p, outs = zip(*(self.rows[r] for r in rows))
        dev = logits.device
        index = torch.tensor(rows, device=dev)
        top_p_t = torch.tensor(top_p, device=dev)
        tokens, _ = sample(logits[index], torch.tensor(temps, device=dev), top_p_t, torch.tensor(keys, device=dev),
                           torch.tensor([len(o) for o in outs], device=dev), any(p < 1 for p in top_p))
        logits[index] = float("-inf")
        logits[index, tokens] = 0.0
        return logits

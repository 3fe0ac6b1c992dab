"""The rows being decoded, as device tensors: what a decode step reads and writes, and nothing else.

Row r holds one request: its last sampled token and that token's position, its sampling
parameters, how many tokens it has drawn, its stop tokens (a row of a rows x vocab table) and
every token and log-prob drawn so far. A decode step (`decode_step`) reads and updates only these
tensors and the KV cache, with the row count and the attended width as Python ints: so on CUDA it
can be captured once per shape and replayed (graphs.py). Rows [0, n) are the live ones; the
scheduler (scheduler.py) admits into rows n.. and moves the last live rows into the holes that
finished ones leave. A finished row is frozen (its `done` flag set): a step that still covers it
changes none of its results.

With `keep_states`, the batch also keeps, for every drawn token, the last hidden state that gave
its logits (the LM head's input), in bfloat16: what a volunteer's TOPLOC proofs commit to
(verify/toploc.py), had without a second forward over prompt and completion. It costs rows x
length x hidden x 2 bytes, so only a worker asks for it.

The model is anything with `prefill` and `decode` (the last hidden states), `head` (their
logits), `move`, `vocab_size` and `hidden_size` (cache.SlotModel; the unit tests use a stand-in).
"""

from __future__ import annotations

from typing import Protocol

import torch

from composer_prime.config.sampling import SamplingParams
from composer_prime.model.sampling import sample, stream_keys


class StepModel(Protocol):
    vocab_size: int
    hidden_size: int

    def prefill(self, prompts: list[list[int]], dst: list[int], src: list[int]) -> torch.Tensor: ...

    def decode(self, tokens: torch.Tensor, pos: torch.Tensor, b: int, w: int) -> torch.Tensor: ...

    def head(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def move(self, src: list[int], dst: list[int], width: int) -> None: ...


class DeviceBatch:
    def __init__(self, model: StepModel, rows: int, length: int, device: torch.device | str = "cpu",
                 keep_states: bool = False) -> None:
        self.model, self.rows, self.length = model, rows, length

        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.tokens, self.pos, self.keys, self.counters, self.budget = (zeros(rows) for _ in range(5))
        self.temps, self.top_p = zeros(rows, dtype=torch.float32), zeros(rows, dtype=torch.float32)
        self.done = torch.ones(rows, dtype=torch.bool, device=device)  # a free row is a finished one
        self.stopped = zeros(rows, dtype=torch.bool)
        self.stops = zeros(rows, model.vocab_size, dtype=torch.bool)
        self.out_tokens = zeros(rows, length)
        self.out_logprobs = zeros(rows, length, dtype=torch.float32)
        self.out_states = zeros(rows, length, model.hidden_size, dtype=torch.bfloat16) if keep_states else None
        self.row_ids = torch.arange(rows, device=device)
        self.device = device

    def admit(self, lo: int, requests: list[tuple[list[int], SamplingParams, int]], use_top_p: bool) -> None:
        """Prefill (prompt, params, seed) requests into rows lo, lo + 1, ... and draw their first tokens."""
        hi = lo + len(requests)
        unique: dict[tuple[int, ...], int] = {}
        src = [unique.setdefault(tuple(p), len(unique)) for p, _, _ in requests]

        def put(t: torch.Tensor, values: list) -> None:
            t[lo:hi] = torch.tensor(values, dtype=t.dtype).to(self.device)

        put(self.temps, [s.temperature for _, s, _ in requests])
        put(self.top_p, [s.top_p for _, s, _ in requests])
        self.keys[lo:hi] = stream_keys([seed for _, _, seed in requests]).to(self.device)
        put(self.budget, [s.max_tokens for _, s, _ in requests])
        put(self.pos, [len(p) - 1 for p, _, _ in requests])  # `advance` moves it to the drawn token's position
        self.counters[lo:hi] = 0
        self.done[lo:hi] = False
        self.stopped[lo:hi] = False
        self.stops[lo:hi] = False
        vocab = self.model.vocab_size
        stop_rows = [lo + i for i, (_, s, _) in enumerate(requests) for t in s.stop_token_ids if 0 <= t < vocab]
        stop_ids = [t for _, s, _ in requests for t in s.stop_token_ids if 0 <= t < vocab]
        if stop_ids:
            self.stops[self._index(stop_rows), self._index(stop_ids)] = True
        hidden = self.model.prefill([list(p) for p in unique], list(range(lo, hi)), src)
        self.advance(lo, hi, hidden[self._index(src)], use_top_p)

    def decode_step(self, b: int, w: int, use_top_p: bool) -> None:
        """One token for each live row of [0, b), attending over the first `w` cache slots."""
        self.advance(0, b, self.model.decode(self.tokens[:b], self.pos[:b], b, w), use_top_p)

    def advance(self, lo: int, hi: int, hidden: torch.Tensor, use_top_p: bool) -> None:
        """Draw one token per row of [lo, hi) from the logits of `hidden`, record it, and freeze the
        rows it finishes."""
        live = ~self.done[lo:hi]
        count = self.counters[lo:hi]
        tokens, logprobs = sample(self.model.head(hidden), self.temps[lo:hi], self.top_p[lo:hi], self.keys[lo:hi],
                                  count, use_top_p)
        rows, at = self.row_ids[lo:hi], count.clamp(max=self.length - 1)
        self.out_tokens[rows, at] = torch.where(live, tokens, self.out_tokens[rows, at])
        self.out_logprobs[rows, at] = torch.where(live, logprobs, self.out_logprobs[rows, at])
        if self.out_states is not None:
            kept = self.out_states[rows, at]
            self.out_states[rows, at] = torch.where(live[:, None], hidden.to(kept.dtype), kept)
        hit = live & self.stops[rows, tokens]
        self.stopped[lo:hi] |= hit
        count += live  # in place: `count` is a view of self.counters
        self.done[lo:hi] |= hit | (count >= self.budget[lo:hi])
        self.pos[lo:hi] += live
        self.tokens[lo:hi] = torch.where(live, tokens, self.tokens[lo:hi])

    def finished(self, n: int) -> list[int]:
        """The rows of [0, n) that are done: the step's one read of the device (a synchronisation; n
        flags copied, where `nonzero` would wait for the device twice, once to size its output)."""
        return [row for row, done in enumerate(self.done[:n].tolist()) if done]

    def results(self, rows: list[int]) -> list[tuple[list[int], list[float], bool, torch.Tensor | None]]:
        """(tokens, log-probs, stopped on a stop token, states on the CPU or None) of each of `rows`."""
        idx = self._index(rows)
        counts, stopped = self.counters[idx].tolist(), self.stopped[idx].tolist()
        width = max(counts)
        toks, lps = self.out_tokens[idx, :width].tolist(), self.out_logprobs[idx, :width].tolist()
        states = self.out_states[idx, :width].cpu() if self.out_states is not None else [None] * len(rows)
        return [(t[:k], lp[:k], s, None if st is None else st[:k]) for t, lp, k, s, st in zip(toks, lps, counts, stopped, states)]

    def move(self, src: list[int], dst: list[int], width: int) -> None:
        """Rows src take the place of rows dst (KV cache included, its first `width` slots); src become free."""
        if not src:
            return
        s, d = self._index(src), self._index(dst)
        for t in (self.tokens, self.pos, self.keys, self.counters, self.budget, self.temps, self.top_p, self.done,
                  self.stopped, self.stops, self.out_tokens, self.out_logprobs, self.out_states):
            if t is not None:
                t[d] = t[s]
        self.model.move(src, dst, width)
        self.free(src)

    def free(self, rows: list[int]) -> None:
        """Mark rows free: finished, at position 0 (a step that covers them writes only their own slot 0)."""
        idx = self._index(rows)
        self.done[idx] = True
        self.pos[idx] = 0
        self.tokens[idx] = 0

    def _index(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

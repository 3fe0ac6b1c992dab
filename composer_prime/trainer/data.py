"""Batch → per-rank micro-batches of padded tensors.

Packing: samples that share a prefix become one row (`prefix`: a group's prompt is computed
once); rows are sorted by length and placed first-fit into micro-batches whose padded size
(rows × longest row) stays within `micro_batch_tokens`; micro-batches are then dealt to ranks
so each rank carries about the same number of tokens. Every rank must run the same number of
forward/backward passes under FSDP, so short ranks get empty (all-zero-weight) micro-batches.

Whatever the rows, a micro-batch's tensors are per sample ([B, T] and [B, T-1]) and
`MicroBatch.logits` returns per-sample logits: channels never see the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from composer_prime.contract.batches import Sample
from composer_prime.trainer.prefix import SharedRows, layout, row_tokens, share, shared_logits


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T]
    sampling_logprobs: torch.Tensor  # [B, T-1], aligned with the predicted tokens input_ids[:, 1:]
    advantages: torch.Tensor  # [B, T-1]
    temperature: torch.Tensor  # [B, 1]
    channel_weights: dict[str, torch.Tensor]  # each [B, T-1]
    channel_data: dict[str, list[tuple[int, Any]]]  # per channel: (row, that sample's channel_data) where present
    rows: SharedRows | None = None  # the forward's layout when samples share prefixes

    def logits(self, model: torch.nn.Module) -> torch.Tensor:
        """Logits [B, T-1, V]: position t predicts input_ids[:, t + 1]."""
        if self.rows is None:
            return model(input_ids=self.input_ids).logits[:, :-1]
        return shared_logits(model, self.rows)[:, :-1]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())


def _groups(samples: list[Sample], share_cap: int | None) -> list[tuple[list[Sample], int]]:
    return share(samples, share_cap) if share_cap else [([s], len(s.input_ids) - 1) for s in samples]


def pack(samples: list[Sample], micro_batch_tokens: int, world_size: int,
         share_cap: int | None = None) -> list[list[list[Sample]]]:
    """Returns, per rank, a list of micro-batches (lists of samples); all ranks get equally many.
    `share_cap`: the longest shared row (None: every sample is its own row)."""
    bins: list[list[tuple[list[Sample], int]]] = []
    for g in sorted(_groups(samples, share_cap), key=row_tokens, reverse=True):
        for b in bins:
            if (len(b) + 1) * row_tokens(b[0]) <= micro_batch_tokens:
                b.append(g)
                break
        else:
            bins.append([g])
    ranks: list[list[list[Sample]]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for b in bins:  # largest first onto the least-loaded rank
        r = load.index(min(load))
        ranks[r].append([s for group, _ in b for s in group])
        load[r] += len(b) * row_tokens(b[0])
    depth = max(len(r) for r in ranks)
    for r in ranks:
        r.extend([] for _ in range(depth - len(r)))
    return ranks


def collate(samples: list[Sample], pad_id: int, channels: list[str], device: str = "cpu",
            share_cap: int | None = None) -> MicroBatch:
    """Padded tensors, built on the CPU row by row and moved to `device` (the model's) once each.
    With `share_cap`, samples sharing a prefix are grouped again here; any grouping gives the same
    logits, so it need not be the one `pack` budgeted with. The rows are then in group order, not
    in the order of `samples`: read what belongs to a row from the micro-batch (`channel_data`)."""
    if not samples:  # a filler micro-batch: one pad token, zero weight in every channel
        samples = [Sample([pad_id, pad_id], [0.0, 0.0], [0.0, 0.0], {c: [0.0, 0.0] for c in channels})]
    groups = _groups(samples, share_cap)
    samples = [s for g, _ in groups for s in g]
    width = max(len(s.input_ids) for s in samples)
    n = len(samples)

    def pad(rows: list[list], value: float, dtype: torch.dtype) -> torch.Tensor:
        out = torch.full((n, width), value, dtype=dtype)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
        return out.to(device)

    shifted = lambda t: t[:, 1:]  # noqa: E731 - position t predicts token t, so drop the first
    return MicroBatch(
        input_ids=pad([s.input_ids for s in samples], pad_id, torch.long),
        sampling_logprobs=shifted(pad([s.sampling_logprobs for s in samples], 0.0, torch.float32)),
        advantages=shifted(pad([s.advantages for s in samples], 0.0, torch.float32)),
        temperature=torch.tensor([[s.temperature] for s in samples], dtype=torch.float32, device=device).unsqueeze(-1),
        channel_weights={
            c: shifted(pad([s.channel_weights.get(c, [0.0] * len(s.input_ids)) for s in samples], 0.0, torch.float32))
            for c in channels
        },
        channel_data={c: [(i, s.channel_data[c]) for i, s in enumerate(samples) if c in s.channel_data] for c in channels},
        rows=layout(groups, width, pad_id).to(device) if len(groups) < n else None,  # plain rows when nothing is shared
    )

"""The `replay` batch step: preference pairs from trace replay, mixed into every `rl` batch.

    [orchestrator.replay]
    dataset = "outputs/replay/dataset"   # from `composer-prime traces dataset` (TRL's format)
    pairs_per_step = 8
    weight = 1.0                         # the pair's weight on its response tokens

Each step draws `pairs_per_step` pairs (a fresh shuffle of the dataset per pass, seeded by the
run's seed, so every pair comes round before any repeats) and adds each as two samples, chosen
and rejected, for the trainer's `dpo` channel (trainer/loss/dpo.py): the token ids rendered by
`traces.dataset.render` (the function the reference log-probs were computed with), weights on
the reply's tokens, and a `PairRow` (composer_prime/contract/dpo.py) from the dataset. Pairs
longer than `seq_len` are skipped and counted.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from pydantic import Field

from composer_prime.config.base import Strict
from composer_prime.config.models import OrchestratorConfig
from composer_prime.contract.batches import Sample
from composer_prime.contract.dpo import PairRow
from composer_prime.orchestrator.batch import BatchContext, Step
from composer_prime.orchestrator.client import InferenceClient
from composer_prime.traces.dataset import render

if TYPE_CHECKING:  # a config check (every `rl` start) loads this module: no transformers
    from transformers import PreTrainedTokenizerBase


class ReplayConfig(Strict):
    dataset: str | None = Field(None, description="pairs from `composer-prime traces dataset` (a datasets directory); "
                                                  "unset: no replay")
    pairs_per_step: int = Field(8, ge=1, description="preference pairs added to every batch")
    weight: float = Field(1.0, gt=0, description="each pair's weight on its reply tokens (the dpo channel)")


class ReplayStep(Step):
    name = "replay"
    Config = ReplayConfig

    def __init__(self, section: ReplayConfig, cfg: OrchestratorConfig, tok: PreTrainedTokenizerBase,
                 client: InferenceClient) -> None:
        super().__init__(section, cfg, tok, client)
        from datasets import load_from_disk

        self.rows = load_from_disk(section.dataset).to_list()
        self.order: list[int] = []
        self.passes = 0

    @classmethod
    def active(cls, section: ReplayConfig) -> bool:
        return section.dataset is not None

    def _next(self) -> int:
        if not self.order:  # a new pass over the dataset, in a new order
            self.order = list(range(len(self.rows)))
            random.Random(f"{self.cfg.seed}-replay-{self.passes}").shuffle(self.order)
            self.passes += 1
        return self.order.pop()

    async def __call__(self, batch: BatchContext) -> dict[str, float]:
        added = too_long = 0
        for k in range(self.section.pairs_per_step):
            i = self._next()
            row = self.rows[i]
            sides = [(side, *render(self.tok, row["prompt"], row[side][0])) for side in ("chosen", "rejected")]
            if max(len(ids) for _, ids, _ in sides) > self.cfg.seq_len:
                too_long += 1
                continue
            for side, ids, start in sides:
                n = len(ids)
                batch.add(Sample(ids, [0.0] * n, [0.0] * n, {"dpo": [0.0] * start + [self.section.weight] * (n - start)},
                                 temperature=1.0, policy_version=batch.step,
                                 channel_data={"dpo": PairRow(pair=f"{i}@{k}", chosen=side == "chosen",
                                                              ref_logp=float(row[f"ref_{side}_logps"]))}))
            added += 1
        return {"pairs": float(added), "too_long": float(too_long), "passes": float(self.passes)}

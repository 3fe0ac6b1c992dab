"""The `replay` batch step: preference pairs from trace replay, mixed into every `rl` batch.

    [orchestrator.replay]
    dataset = "outputs/replay/dataset"   # from `composer-prime traces dataset` (TRL's format)
    pairs_per_step = 8
    weight = 1.0                         # the pair's weight on its response tokens

Each step draws `pairs_per_step` pairs (a fresh shuffle of the dataset per pass, seeded by the
run's seed, so every pair comes round before any repeats) and adds each as two samples, chosen
and rejected, for the trainer's `dpo` channel (trainer/loss/dpo.py), made by
`traces.dpo_rows.pair_samples` (as `sft --objective dpo` makes them): the token ids rendered by the
function the reference log-probs were computed with, weights on the reply's tokens, and a
`PairRow` (composer_prime/contract/dpo.py) from the dataset. Pairs longer than `seq_len` are
skipped and counted.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from pydantic import Field

from composer_prime.config.base import Strict
from composer_prime.config.models import OrchestratorConfig
from composer_prime.orchestrator.batch import BatchContext, Step
from composer_prime.orchestrator.client import InferenceClient
from composer_prime.traces.dpo_rows import pair_samples

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
            rows = pair_samples(self.tok, self.rows[i], f"{i}@{k}", self.section.weight, batch.step)
            if max(len(r.input_ids) for r in rows) > self.cfg.seq_len:
                too_long += 1
                continue
            for r in rows:
                batch.add(r)
            added += 1
        return {"pairs": float(added), "too_long": float(too_long), "passes": float(self.passes)}

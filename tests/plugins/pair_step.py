"""A batch step defined outside the package, for tests: a stand-in for the next channel (dpo from
trace replay) that adds whole samples with its own weights and data, configured by its own
section. Loaded by name (`tests.plugins.pair_step:PairStep`) as a user's plug-in would be."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from composer_prime.contract.batches import Sample
from composer_prime.orchestrator.batch import BatchContext, Step


class PairConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pairs: int = 1


class PairStep(Step):
    name = "pairs"
    Config = PairConfig

    async def __call__(self, batch: BatchContext) -> dict[str, float]:
        for k in range(self.section.pairs):
            batch.add(Sample([1, 2, 3, 4], [0.0] * 4, [0.0] * 4, {"dpo": [0.0, 0.0, 1.0, 1.0]},
                             channel_data={"dpo": {"pair": k}}))
        return {"added": self.section.pairs}

"""The `replay` batch step: preference pairs from trace replay, mixed into every `rl` batch.

    [orchestrator.replay]
    dataset = "outputs/replay/dataset"   # from `composer-prime traces dataset` (TRL's format)
    pairs_per_step = 8
    max_share = 0.2                      # at most this fraction of the batch's samples are pair rows [1: no cap]
    weight = 0.5                         # the pair's weight on its response tokens at step 0 [1.0]
    weight_end = 0.02                    # decayed to this over decay_steps, cosine or linear [unset: no decay]
    decay_steps = 20
    divergence_tokens = 1                # > 0: the loss on that many tokens from where the pair's replies differ [0]

(configs/replay.toml's values, which benchmarks/replay_ab.py chose; the defaults in brackets.)

Each step draws pairs (a fresh shuffle of the dataset per pass, seeded by the run's seed, so every
pair comes round before any repeats) and adds each as two samples, chosen and rejected, for the
trainer's `dpo` channel (trainer/loss/dpo.py), made by `traces.dpo_rows.pair_samples` (as
`sft --objective dpo` makes them). Pairs longer than `seq_len` are skipped and counted.

Why the three knobs (CHORD, arXiv 2508.11408: off-policy data mixed into RL first lowers reward;
it keeps the expert share at 20% and decays the auxiliary weight 0.5 -> 0.02):

    share cap:  n samples already in the batch, share c < 1:
                pairs = min(pairs_per_step, floor(c * n / (2 * (1 - c))))   so 2*pairs / (n + 2*pairs) <= c
    decay:      w(s) = w_end + (w_0 - w_end) * f(min(s, K) / K),   K = decay_steps (0: w(s) = w_0)
                f(x) = (1 + cos(pi * x)) / 2  (cosine)  or  1 - x  (linear)
    divergence: see traces/dpo_rows.py (the reference must then be the trainer's).
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

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
    pairs_per_step: int = Field(8, ge=1, description="preference pairs added to every batch (at most; see max_share)")
    weight: float = Field(1.0, gt=0, description="each pair's weight on its reply tokens (the dpo channel) at step 0")
    max_share: float = Field(1.0, gt=0, le=1, description="at most this fraction of the batch's samples are pair rows "
                                                          "(1: no cap; CHORD's expert share is 0.2)")
    weight_end: float | None = Field(None, gt=0, description="the weight decays from `weight` to this over "
                                                             "decay_steps (unset: no decay)")
    decay_steps: int = Field(0, ge=0, description="steps over which the weight decays to weight_end (then stays)")
    schedule: Literal["cosine", "linear"] = Field("cosine", description="the decay's shape")
    divergence_tokens: int = Field(0, ge=0, description="0: the loss on every reply token; k: on the k tokens from the "
                                                        "first where chosen and rejected differ (needs "
                                                        "trainer.loss.dpo.reference = initial or recent)")

    @model_validator(mode="after")
    def _decay_complete(self) -> ReplayConfig:
        if (self.weight_end is None) != (self.decay_steps == 0):
            raise ValueError("weight_end and decay_steps go together: set both to decay the weight, neither to keep it")
        return self


def pair_weight_at(section: ReplayConfig, step: int) -> float:
    """w(step): `weight` decayed to `weight_end` over `decay_steps` (the module's formula)."""
    if section.weight_end is None:
        return section.weight
    x = min(step, section.decay_steps) / section.decay_steps
    f = (1 + math.cos(math.pi * x)) / 2 if section.schedule == "cosine" else 1 - x
    return section.weight_end + (section.weight - section.weight_end) * f


def pairs_allowed(section: ReplayConfig, n_samples: int) -> int:
    """How many pairs a batch of `n_samples` other samples takes under the share cap."""
    c = section.max_share
    if c >= 1:
        return section.pairs_per_step
    return min(section.pairs_per_step, math.floor(c * n_samples / (2 * (1 - c)) + 1e-9))  # 1e-9: 0.2*32/1.6 is 4


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
        want, weight = pairs_allowed(self.section, len(batch.samples)), pair_weight_at(self.section, batch.step)
        for k in range(want):
            i = self._next()
            rows = pair_samples(self.tok, self.rows[i], f"{i}@{k}", weight, batch.step, self.section.divergence_tokens)
            if max(len(r.input_ids) for r in rows) > self.cfg.seq_len:
                too_long += 1
                continue
            for r in rows:
                batch.add(r)
            added += 1
        return {"pairs": float(added), "too_long": float(too_long), "passes": float(self.passes), "weight": weight}

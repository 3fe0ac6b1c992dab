"""The batch being built, and the batch step: how a loss channel's orchestrator side adds to it.

Collection (orchestrator.py) samples groups, refills flat ones and drops stale ones; the kept
groups become `rl` samples. Then each active step runs on the `BatchContext`: it may add its
channel's weights and `channel_data` to those samples (distill: the error turns and their
teachers), add whole samples of its own (distill: error turns of flat groups; next, replayed
dpo pairs), and it returns its metrics, which the orchestrator records as `<name>/<metric>`.

A step is one module defining a `Step` subclass with its config section (`orchestrator.<name>`),
registered by one entry point in the `composer_prime.batch_steps` group (pyproject.toml) or,
for a module outside the package, named in `orchestrator.plugins` ("module:Class"). Steps run
in the order of their names; collection and batch building never name one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel

from composer_prime.config.base import Strict
from composer_prime.config.models import OrchestratorConfig
from composer_prime.contract.batches import Sample

if TYPE_CHECKING:  # annotations only: a config check loads this module without transformers or verifiers
    from transformers import PreTrainedTokenizerBase

    from composer_prime.orchestrator.client import InferenceClient
    from composer_prime.orchestrator.rollouts import Rollout


@dataclass
class BatchContext:
    step: int
    samples: list[Sample] = field(default_factory=list)  # the batch so far: the kept groups' rl samples first
    rollouts: list[Rollout | None] = field(default_factory=list)  # samples[i] came from rollouts[i] (None: added whole)
    flat: list[Rollout] = field(default_factory=list)  # rollouts of groups dropped for a flat reward (not in the batch)
    seen: list[Rollout] = field(default_factory=list)  # every rollout sampled for this batch: kept, flat and stale

    def add(self, sample: Sample, rollout: Rollout | None = None) -> None:
        self.samples.append(sample)
        self.rollouts.append(rollout)


class Step:
    """A channel's orchestrator side. Subclasses set `name` and `Config` and override `__call__`
    (and `active`, `close` when they need to)."""

    name: ClassVar[str]
    Config: ClassVar[type[BaseModel]] = Strict

    def __init__(self, section: BaseModel, cfg: OrchestratorConfig, tok: PreTrainedTokenizerBase,
                 client: InferenceClient) -> None:
        self.section, self.cfg, self.tok, self.client = section, cfg, tok, client

    @classmethod
    def active(cls, section: BaseModel) -> bool:
        """Whether this run uses the step (e.g. its section's `enabled`)."""
        return True

    async def __call__(self, batch: BatchContext) -> dict[str, float]:
        """Add to the batch; return this step's metrics (recorded as `<name>/<metric>`)."""
        raise NotImplementedError

    async def close(self) -> None:
        """At the end of the run: release what the step holds (clients, caches)."""


def make_steps(cfg: OrchestratorConfig, tok: PreTrainedTokenizerBase, client: InferenceClient) -> dict[str, Step]:
    """The active steps, by name, in the order they run."""
    classes = cfg.step_classes()
    return {name: classes[name](cfg.section(name), cfg, tok, client) for name in sorted(classes)
            if classes[name].active(cfg.section(name))}

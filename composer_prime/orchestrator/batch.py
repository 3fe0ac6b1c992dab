"""The batch being built, and the step protocol through which a loss channel adds to it.

Collection (orchestrator.py) samples groups, refills flat ones and drops stale ones; the kept
groups become `rl` samples. Then each active step runs on the `BatchContext`: it may add its
channel's weights and `channel_data` to those samples (distill: the error turns and their
teachers), add whole samples of its own (distill: error turns of flat groups; next, replayed
dpo pairs), and it returns its metrics, which the orchestrator records under `<step name>/`.
Steps are registered by name in orchestrator/steps.py; collection never names a channel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from composer_prime.orchestrator.rollouts import Rollout
from composer_prime.transports.batches.schema import Sample


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


class Step(Protocol):
    """A channel's orchestrator side: adds to the batch, returns its own metrics."""

    async def __call__(self, batch: BatchContext) -> dict[str, float]: ...

    async def close(self) -> None: ...

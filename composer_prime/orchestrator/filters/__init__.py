"""The rollout-filter stage: what decides, group by group, after sampling and before advantages,
whether a group goes into the batch.

Collection (orchestrator.py) samples a group, shapes its rewards, then asks each active filter in
turn (by `order`); the first to refuse drops the group, counted under the filter's `name` in the
step's metrics (`count`: groups by default, or rollouts). A filter with `keep_aside` has the groups
it drops kept in `Collected.flat` for the batch steps that use them (distill hints the error turns
of flat groups). Staleness and dynamic sampling are the first two; a volunteer's proof check
joins the same way. A filter is one module defining a `Filter` subclass, registered by one entry
point in the `composer_prime.rollout_filters` group (pyproject.toml); collection names none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from composer_prime.config.models import OrchestratorConfig
from composer_prime.utils import plugins

if TYPE_CHECKING:
    from composer_prime.orchestrator.rollouts import Rollout

ROLLOUT_FILTERS = "composer_prime.rollout_filters"  # the entry-point group filters register in


class Filter:
    """Subclasses set `name`, `order` and override `keeps` (and `active`, `count` when needed)."""

    name: ClassVar[str]  # the metric counting what it drops
    order: ClassVar[int]  # filters run lowest first
    keep_aside: ClassVar[bool] = False  # its dropped groups go to Collected.flat

    def __init__(self, cfg: OrchestratorConfig) -> None:
        self.cfg = cfg

    @classmethod
    def active(cls, cfg: OrchestratorConfig) -> bool:
        return True

    def keeps(self, step: int, group: list[Rollout], shaped: list[float]) -> bool:
        """Whether the group, sampled for trainer step `step` with these shaped rewards, goes on."""
        raise NotImplementedError

    def count(self, group: list[Rollout]) -> int:
        """How a dropped group adds to the filter's metric: 1 (a group)."""
        return 1


def make_filters(cfg: OrchestratorConfig) -> list[Filter]:
    """The active filters, in the order they run."""
    classes = sorted(plugins.load(ROLLOUT_FILTERS).values(), key=lambda c: (c.order, c.name))
    return [c(cfg) for c in classes if c.active(cfg)]


def metric_names() -> list[str]:
    """Every registered filter's metric, active or not: a step's metrics keep the same keys."""
    return sorted(plugins.names(ROLLOUT_FILTERS))

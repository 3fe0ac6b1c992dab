"""Staleness: a group sampled by a policy more than `max_async_level` steps older than the step it
is for is dropped, never trained on; counted in rollouts (`stale`)."""

from __future__ import annotations

from composer_prime.orchestrator.filters import Filter


class Staleness(Filter):
    name = "stale"
    order = 10

    def keeps(self, step, group, shaped) -> bool:
        return min(r.weight_version for r in group) >= step - self.cfg.max_async_level

    def count(self, group) -> int:
        return len(group)

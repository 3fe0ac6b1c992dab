"""The `unverified` rollout filter: a group with any completion the volunteers' validator rejected
(volunteer/validator.py) is dropped, counted in rollouts, so nothing a volunteer sent reaches a
batch unless it passed."""

from __future__ import annotations

from composer_prime.orchestrator.filters import Filter


class Unverified(Filter):
    """A group with any completion the validator rejected is dropped, counted in rollouts."""

    name = "unverified"
    order = 5  # before staleness: a rejected rollout is never counted as merely stale

    @classmethod
    def active(cls, cfg) -> bool:
        return cfg.volunteers.enabled

    def keeps(self, step, group, shaped) -> bool:
        return not any(r.unverified for r in group)

    def count(self, group) -> int:
        return len(group)

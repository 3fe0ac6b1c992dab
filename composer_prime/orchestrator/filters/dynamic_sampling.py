"""Dynamic sampling (DAPO): a group whose shaped rewards are all equal has no advantage to learn
from; it is dropped and collection samples another (`orchestrator.dynamic_sampling`). Counted in
groups (`flat_groups`); its rollouts stay aside for the batch steps that use them."""

from __future__ import annotations

from composer_prime.orchestrator.advantages import has_spread
from composer_prime.orchestrator.filters import Filter


class DynamicSampling(Filter):
    name = "flat_groups"
    order = 20
    keep_aside = True

    @classmethod
    def active(cls, cfg) -> bool:
        return cfg.dynamic_sampling

    def keeps(self, step, group, shaped) -> bool:
        return has_spread(shaped)

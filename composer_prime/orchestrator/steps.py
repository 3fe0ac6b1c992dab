"""The registered batch steps, by name; a step's metrics are recorded as `<name>/<metric>`.

Each entry builds its step from the orchestrator's config, or returns None when its channel is
off. A new channel's orchestrator side is one module with such a factory and one entry here
(and its config section); collection and batch building do not change.
"""

from __future__ import annotations

from collections.abc import Callable

from transformers import PreTrainedTokenizerBase

from composer_prime.config import OrchestratorConfig
from composer_prime.orchestrator import distill
from composer_prime.orchestrator.batch import Step
from composer_prime.orchestrator.client import InferenceClient

Factory = Callable[[OrchestratorConfig, PreTrainedTokenizerBase, InferenceClient], Step | None]
STEPS: dict[str, Factory] = {"distill": distill.make_step}  # run in this order


def make_steps(cfg: OrchestratorConfig, tok: PreTrainedTokenizerBase, client: InferenceClient) -> dict[str, Step]:
    """The active steps, by name."""
    return {name: step for name, make in STEPS.items() if (step := make(cfg, tok, client)) is not None}

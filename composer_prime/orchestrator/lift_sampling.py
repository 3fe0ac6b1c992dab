"""Hint lift inside a run (the distill step's `lift_samples` and `gate`): drawing an error turn with and
without its hint through the run's inference client, and the gate's configuration.

The draws go through the same token route as rollouts (`InferenceClient.generate`), K seeds per
site shared by both contexts; each draw is checked by the environment's turn check
(hint_lift.turn_valid) against a fresh tool session of the rollout's task, in the rollout's CallBox (a
tool that never returns makes the draw invalid after call_timeout_s, as it drops a rollout). A stateful environment's
tool error at a later turn is therefore checked without the earlier turns' effects (tool-calc's
tool is stateless). What comes back is hint_lift.SiteDraws, added to the step's LiftTracker.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from composer_prime.config.base import Strict
from composer_prime.orchestrator.hint_lift import LiftGate, LiftTracker, SiteDraws, draw_site, turn_valid

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from composer_prime.env_runtime.error_sites import ErrorSite
    from composer_prime.orchestrator.client import InferenceClient
    from composer_prime.orchestrator.rollouts import Rollout


class GateConfig(Strict):
    """`orchestrator.distill.gate`: stop distilling error kinds whose hint lift is not measurably above 0."""

    enabled: bool = Field(False, description="skip error kinds whose measured hint lift's interval does not lie above 0")
    lift_file: Path | None = Field(None, description="a benchmarks/hint_lift.py result (its intervals per kind)")
    env: str = Field("tool-calc", description="which environment's rows of lift_file to read")
    min_sites: int = Field(8, ge=1, description="with lift_samples: a kind is judged on the run's own draws once "
                                                "this many of its sites were drawn")


def load_gate(cfg: GateConfig, tracker: LiftTracker) -> LiftGate | None:
    if not cfg.enabled:
        return None
    measured = {}
    if cfg.lift_file is not None:
        measured = LiftGate.from_result(json.loads(cfg.lift_file.read_text()), cfg.env).measured
    return LiftGate(measured, tracker, cfg.min_sites)


class LiftSampler:
    def __init__(self, client: InferenceClient, tok: PreTrainedTokenizerBase, k: int, max_tokens: int = 48,
                 temperature: float = 1.0) -> None:
        self.client, self.tok, self.k = client, tok, k
        self.max_tokens, self.temperature = max_tokens, temperature  # the run's sampling (DistillStep sets them)

    async def draw(self, r: Rollout, site: ErrorSite, plain_ids: list[int], hint_ids: list[int], seed: int) -> SiteDraws:
        from composer_prime.config.sampling import SamplingParams
        from composer_prime.env_runtime.episode import EpisodeFault, open_episode

        params = SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature).or_eos(self.tok.eos_token_id)

        async def draw(ids: list[int], s: int) -> tuple[str, str]:
            c = await self.client.generate(ids, params.model_copy(update={"seed": s}))
            return self.tok.decode(c.token_ids, skip_special_tokens=True), c.finish_reason

        async def check(text: str, finish: str) -> bool:
            """A draw whose session fails or times out (in the rollout's CallBox, as the rollout's own calls) is not valid."""
            try:
                opened = await open_episode(r.task, r.box)
            except EpisodeFault:
                return False
            try:
                session = opened if opened.session is not None else None  # Opened.call: in the box, under its timeout
                return await turn_valid(text, finish, r.tools, session, getattr(r.task, "error_rules", None))
            except EpisodeFault:
                return False
            finally:
                with contextlib.suppress(EpisodeFault):
                    await opened.close()

        seeds = range(seed * self.k, seed * self.k + self.k)
        return await draw_site(r.env, site.kind, plain_ids, hint_ids, draw, check, seeds)

"""Hint self-distillation, orchestrator side: hint each error site, build the teacher's view.

For each error turn (up to `max_sites` per rollout) the hinter chain writes a hint; the teacher
context is the student's token ids with the hint message spliced in before that turn
(teachers.py). With `teacher = "inference"` the inference server also scores the teacher
context (its prefill's top-k log-probs travel with the batch); by default the trainer scores it.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from transformers import PreTrainedTokenizerBase

from composer_prime.config.models import DistillConfig
from composer_prime.orchestrator.client import InferenceClient
from composer_prime.orchestrator.hints import HintContext, make_hinter
from composer_prime.orchestrator.rollouts import Rollout
from composer_prime.orchestrator.teachers import history_before, teacher_view
from composer_prime.utils.chat import TemplateError


@dataclass
class DistillStats:
    sites: int = 0
    hinted: int = 0  # sites that got a teacher
    no_hint: int = 0  # every hinter declined (or the LLM hinter failed)
    template: int = 0  # the chat template could not take a spliced hint
    unscored: int = 0  # teacher = "inference": the server refused the context (e.g. longer than its max_model_len)


class Distiller:
    def __init__(self, cfg: DistillConfig, tok: PreTrainedTokenizerBase, client: InferenceClient) -> None:
        h = cfg.hints
        self.cfg, self.tok, self.client = cfg, tok, client
        self.hinter = make_hinter(h.sources, h.templates, h.llm_url, h.llm_model, h.llm_timeout_s, h.cache_path)

    async def attach(self, r: Rollout, stats: DistillStats) -> None:
        """Give `r` one teacher per hinted error site (replacing any it had)."""
        r.teachers = []
        p, ids = len(r.prompt_ids), r.prompt_ids + r.completion_ids
        for site in r.sites[: self.cfg.max_sites]:
            stats.sites += 1
            turn = r.turns[site.turn]
            history = history_before(r.opening, r.turns, site.turn)
            hint = await self.hinter(site, HintContext(history, turn.text, r.tools, r.task))
            if not hint:
                stats.no_hint += 1
                continue
            try:
                t = teacher_view(self.tok, ids, p + turn.start, p + turn.end, history, hint,
                                 self.cfg.hints.role)
            except TemplateError:
                stats.template += 1
                continue
            if self.cfg.teacher == "inference":
                try:
                    scores = await self.client.score(t.input_ids, t.start, self.cfg.top_k)
                except httpx.HTTPStatusError:  # a refused context costs this site, not the run
                    stats.unscored += 1
                    continue
                t.top_ids, t.top_logprobs = scores.top_ids, scores.top_logprobs
            r.teachers.append(t)
            stats.hinted += 1

    async def close(self) -> None:
        await self.hinter.close()

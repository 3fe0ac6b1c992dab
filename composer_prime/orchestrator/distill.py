"""Hint self-distillation, orchestrator side: the `distill` batch step.

For each error turn (up to `max_sites` per rollout) the hinter chain writes a hint; the teacher
context is the student's token ids with the hint message spliced in before that turn
(teachers.py). With `teacher = "inference"` the inference server also scores the teacher
context (its prefill's top-k log-probs travel with the batch); by default the trainer scores it.
The step hints the error turns of every rollout in the batch and (`flat_groups`) of rollouts
whose group was dropped for a flat reward, which join the batch as distill-only samples; the
channel's weights mark each error turn, its `channel_data` holds the teacher views.

Two guards (benchmarks/README.md#distill_ab says why). `only_failed`: only the error turns of
samples whose rl advantage is negative are distilled (the reward sets the sign; the trainer's
`trainer.loss.distill.guard` enforces the same, so a batch of flat groups cannot carry a distill
step of its own). `gate`: a kind whose measured hint lift (hint_lift.py) does not lie above 0 is
not distilled at all. With `lift_samples` = K the step also draws each hinted turn K times with
and without its hint and logs `distill/hint_lift/<kind>` over the run so far.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from composer_prime.config.base import Strict
from composer_prime.config.models import OrchestratorConfig
from composer_prime.contract.batches import Sample
from composer_prime.contract.distill import Teacher
from composer_prime.orchestrator.batch import BatchContext, Step
from composer_prime.orchestrator.client import InferenceClient, RefusedRequest
from composer_prime.orchestrator.hint_arms import PlaceboHinter
from composer_prime.orchestrator.hint_lift import LiftGate, LiftTracker
from composer_prime.orchestrator.hints import HintConfig, HintContext, make_hinter
from composer_prime.orchestrator.lift_sampling import GateConfig, LiftSampler, load_gate
from composer_prime.orchestrator.teachers import history_before, teacher_view
from composer_prime.utils.chat import TemplateError

if TYPE_CHECKING:  # annotations only: a config check (every `rl` start) loads this module without verifiers,
    from transformers import PreTrainedTokenizerBase  # transformers or torch (about 3 s)

    from composer_prime.orchestrator.rollouts import Rollout


class DistillConfig(Strict):
    """`orchestrator.distill`: find error sites, hint them, ship teacher contexts."""

    enabled: bool = Field(False, description="find error sites, hint them and ship teacher views (the distill channel's data)")
    teacher: Literal["trainer", "inference"] = Field("trainer", description="who scores the teacher context "
                                                                            "(trainer/loss/distill_teacher.py says why)")
    top_k: int = Field(20, ge=1, description='teacher = "inference": how many log-probs per position come back')
    max_sites: int = Field(4, ge=1, description="hinted error turns per rollout")
    flat_groups: bool = Field(False, description="also distill error turns of groups dropped for a flat reward "
                                                 "(rl weight 0; at most batch_size rollouts; the trainer's guard "
                                                 "trains them only with guard = \"none\")")
    only_failed: bool = Field(True, description="distill only error turns of samples whose rl advantage is negative")
    lift_samples: int = Field(0, ge=0, description="per hinted site, draw the turn this many times with and without "
                                                   "its hint: distill/hint_lift/<kind> (0: no extra sampling)")
    gate: GateConfig = Field(default_factory=GateConfig)
    hints: HintConfig = Field(default_factory=HintConfig)


@dataclass
class DistillStats:
    sites: int = 0
    hinted: int = 0  # sites that got a teacher
    no_hint: int = 0  # every hinter declined (or the LLM hinter failed)
    template: int = 0  # the chat template could not take a spliced hint
    unscored: int = 0  # teacher = "inference": the server refused the context (e.g. longer than its max_model_len)
    gated: int = 0  # its kind's measured lift does not lie above 0 (the gate)
    not_failed: int = 0  # its sample's advantage is not negative (only_failed)


class Distiller:
    def __init__(self, cfg: DistillConfig, tok: PreTrainedTokenizerBase, client: InferenceClient) -> None:
        h = cfg.hints
        self.cfg, self.tok, self.client = cfg, tok, client
        self.hinter = make_hinter(h.sources, h.templates, h.llm_url, h.llm_model, h.llm_timeout_s, h.cache_path)
        if h.placebo != "off":  # the control arm: the same chain, its hints emptied of their information
            self.hinter = PlaceboHinter(self.hinter, h.placebo)
        self.tracker = LiftTracker()
        self.gate: LiftGate | None = load_gate(cfg.gate, self.tracker)
        self.sampler = LiftSampler(client, tok, cfg.lift_samples) if cfg.lift_samples and client is not None else None

    async def attach(self, r: Rollout, stats: DistillStats, failed: bool = True, seed: int = 0) -> list[Teacher]:
        """One teacher per hinted error site of `r` (none unless `failed`, with only_failed)."""
        teachers = []
        p, ids = len(r.prompt_ids), r.prompt_ids + r.completion_ids
        for i, site in enumerate(r.sites[: self.cfg.max_sites]):
            stats.sites += 1
            if self.cfg.only_failed and not failed:
                stats.not_failed += 1
                continue
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
            if self.sampler is not None:  # measured even where the gate is closed: a kind may open again
                self.tracker.add(await self.sampler.draw(r, site, ids[: p + turn.start], t.input_ids[: t.start], seed + i))
            if self.gate is not None and not self.gate.open(site.kind):
                stats.gated += 1
                continue
            if self.cfg.teacher == "inference":
                try:
                    scores = await self.client.score(t.input_ids, t.start, self.cfg.top_k)
                except RefusedRequest:  # a refused context costs this site, not the run
                    stats.unscored += 1
                    continue
                t.top_ids, t.top_logprobs = scores.top_ids, scores.top_logprobs
            teachers.append(t)
            stats.hinted += 1
        return teachers

    async def close(self) -> None:
        await self.hinter.close()


def with_teachers(sample: Sample, teachers: list[Teacher]) -> Sample:
    """Add the distill channel to `sample`: weight 1 on each error turn whose teacher fits in it
    (an error turn cut by seq_len is not distilled)."""
    n = len(sample.input_ids)
    kept = [t for t in teachers if t.student_start + t.length <= n]
    if kept:
        weights = [0.0] * n
        for t in kept:
            weights[t.student_start: t.student_start + t.length] = [1.0] * t.length
        sample.channel_weights["distill"] = weights
        sample.channel_data["distill"] = [asdict(t) for t in kept]
    return sample


def distill_only(r: Rollout, teachers: list[Teacher], temperature: float, seq_len: int) -> Sample | None:
    """A sample of a flat group's rollout that trains only its error turns; None when none survived the cut."""
    sample = r.to_sample(0.0, temperature, seq_len)
    sample.channel_weights["rl"] = [0.0] * len(sample.input_ids)  # its group had no reward spread to learn from
    sample = with_teachers(sample, teachers)
    return sample if "distill" in sample.channel_data else None


class DistillStep(Step):
    name = "distill"
    Config = DistillConfig

    def __init__(self, section: DistillConfig, cfg: OrchestratorConfig, tok: PreTrainedTokenizerBase,
                 client: InferenceClient) -> None:
        super().__init__(section, cfg, tok, client)
        self.distiller = Distiller(section, tok, client)
        if self.distiller.sampler is not None:  # the lift's draws are the run's own turns: its budget and temperature
            self.distiller.sampler.max_tokens = cfg.sampling.max_tokens
            self.distiller.sampler.temperature = cfg.sampling.temperature

    @classmethod
    def active(cls, section: DistillConfig) -> bool:
        return section.enabled

    async def __call__(self, batch: BatchContext) -> dict[str, float]:
        cfg, stats = self.cfg, DistillStats()
        kept = [(i, r) for i, r in enumerate(batch.rollouts) if r is not None]
        # at most one batch's worth: refill rounds can leave many flat groups, and the trainer's step time follows
        flat = [r for r in batch.flat if r.sites][: cfg.batch_size] if self.section.flat_groups else []
        seed = self.cfg.seed * 1_000_003 + batch.step * 10_007  # the lift draws' seeds: fixed per run and step
        failed = [min(batch.samples[i].advantages, default=0.0) < 0 for i, _ in kept]
        found = await asyncio.gather(*(self.distiller.attach(r, stats, f, seed + 100 * j) for j, ((_, r), f) in enumerate(zip(kept, failed))),
                                     *(self.distiller.attach(r, stats, not self.section.only_failed) for r in flat))
        for (i, _), teachers in zip(kept, found):
            with_teachers(batch.samples[i], teachers)
        added = 0
        for r, teachers in zip(flat, found[len(kept):]):
            if teachers and (sample := distill_only(r, teachers, cfg.sampling.temperature, cfg.seq_len)) is not None:
                batch.add(sample, r)
                added += 1
        gate = self.distiller.gate
        return {"sites": stats.sites, "hinted": stats.hinted, "no_hint": stats.no_hint,
                "template_misses": stats.template, "unscored": stats.unscored, "distill_only_samples": added,
                "gated": stats.gated, "not_failed": stats.not_failed, **self.distiller.tracker.metrics(),
                **({f"gate/{k}": float(gate.open(k)) for k in sorted({s.kind for r in batch.seen for s in r.sites})}
                   if gate is not None else {}),
                "hinted_frac": sum(bool(t) for t in found) / max(1, len(batch.seen)),
                "tokens": sum(t["length"] for s in batch.samples for t in s.channel_data.get("distill", []))}

    async def close(self) -> None:
        await self.distiller.close()

"""Hint lift: how much more often the policy gets an error turn right with the hint than without it.

At an error site the erring turn is drawn K times from the student's context (no hint) and K times
from the teacher's (the hint spliced in before the turn, orchestrator/teachers.py), with the same
K seeds on both sides, and each draw is scored by the environment's own turn check (`turn_valid`:
the call parses, names a real tool, its arguments pass the schema, the tool answers without an
error, and the environment's own rules, e.g. tool-calc's bare-number reply, pass):

    H = P(valid | hint) − P(valid | no hint)

pooled over the sites of one (environment, error kind). Its interval is a percentile bootstrap
that resamples whole sites (a site's K draws share one context, so they are not independent). A
placebo hint (the hint's words shuffled, or another kind's hint: hint_arms.py) gives H_placebo,
which is about 0 where what helps is the hint's information rather than its presence.

Why measure it: the gain of hint self-distillation over plain RL grows about linearly with H
measured before training and is zero where H is zero (arXiv 2605.30070). `LiftGate` stops the
distill channel spending gradient on a kind whose interval does not lie above 0.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from composer_prime.env_runtime.error_sites import detect
from composer_prime.env_runtime.tool_calls import parse_tool_call
from composer_prime.env_runtime.turns import Turn

ARMS = ("hint", "plain", "placebo", "oracle")  # the teacher's context, the student's, a placebo's, an oracle's


@dataclass
class SiteDraws:
    """One error site's draws: each arm's validity per seed, and the teacher-student gap on the
    erring turn's own tokens y (mean and minimum over the turn of log p_T(y) − log p_S(y))."""

    env: str
    kind: str
    hint: list[bool]
    plain: list[bool]
    placebo: list[bool] = field(default_factory=list)
    oracle: list[bool] = field(default_factory=list)  # a teacher shown the correct turn (hint_arms.py)
    gap_mean: float | None = None
    gap_min: float | None = None


async def turn_valid(text: str, finish_reason: str, tools: list[dict], session: Any, rules: Sequence | None = None) -> bool:
    """The environment's own check of one turn: no error site from the default rules (parse,
    unknown tool, arguments against the schema, the tool's error reply: the call is run in
    `session`) nor the environment's `rules`. A turn cut by its token budget is not valid."""
    if finish_reason != "stop":
        return False
    turn = Turn(text, finish_reason, call=parse_tool_call(text))
    if turn.call is not None:
        if turn.call.error:
            turn.result = {"content": turn.call.error, "is_error": True, "done": False}
        elif session is not None:
            turn.result = await session.call(turn.call.name, turn.call.arguments)
    return not detect([turn], tools, rules)


def rate(draws: Sequence[SiteDraws], arm: str) -> float:
    """P(valid) of one arm, pooled over every draw of `draws` (equal K per site: the mean of the sites' rates)."""
    values = [v for s in draws for v in getattr(s, arm)]
    return sum(values) / len(values) if values else float("nan")


def lift(draws: Sequence[SiteDraws], arm: str = "hint") -> float:
    """H = P(valid | arm) − P(valid | no hint)."""
    return rate(draws, arm) - rate(draws, "plain")


def bootstrap(draws: Sequence[SiteDraws], stat: Callable[[Sequence[SiteDraws]], float], n: int = 1000,
              seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of `stat` over `n` resamples of the sites with replacement (fixed `seed`)."""
    if not draws:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    values = sorted(stat([draws[rng.randrange(len(draws))] for _ in draws]) for _ in range(n))
    lo = values[int((1 - level) / 2 * (n - 1))]
    hi = values[int(round((1 + level) / 2 * (n - 1)))]
    return lo, hi


def row(draws: Sequence[SiteDraws], n_boot: int = 1000, seed: int = 0) -> dict:
    """One table row: sites, each arm's P(valid), H with its interval, the placebo's and the oracle's
    H with theirs (where drawn) and the gap's means."""
    out = {"sites": len(draws), "draws": len(draws[0].hint) if draws else 0,
           "p_hint": rate(draws, "hint"), "p_plain": rate(draws, "plain"),
           "lift": lift(draws), "lift_ci": list(bootstrap(draws, lift, n_boot, seed))}
    for arm in ("placebo", "oracle"):
        if draws and all(getattr(s, arm) for s in draws):
            out |= {f"p_{arm}": rate(draws, arm), f"{arm}_lift": lift(draws, arm),
                    f"{arm}_ci": list(bootstrap(draws, lambda d, arm=arm: lift(d, arm), n_boot, seed))}
    gaps = [s for s in draws if s.gap_mean is not None]
    if gaps:
        out |= {"gap_mean": sum(s.gap_mean for s in gaps) / len(gaps), "gap_min": sum(s.gap_min for s in gaps) / len(gaps)}
    return out


def summarise(draws: Sequence[SiteDraws], n_boot: int = 1000, seed: int = 0) -> dict[str, dict[str, dict]]:
    """environment -> error kind (and "all") -> `row`."""
    out: dict[str, dict[str, dict]] = {}
    for env in sorted({s.env for s in draws}):
        mine = [s for s in draws if s.env == env]
        out[env] = {kind: row([s for s in mine if s.kind == kind], n_boot, seed) for kind in sorted({s.kind for s in mine})}
        out[env]["all"] = row(mine, n_boot, seed)
    return out


Draw = Callable[[list[int], int], Awaitable[tuple[str, str]]]  # (context ids, seed) -> (turn text, finish reason)
Check = Callable[[str, str], Awaitable[bool]]  # (turn text, finish reason) -> valid


async def draw_site(env: str, kind: str, plain_ids: list[int], hint_ids: list[int], draw: Draw, check: Check,
                    seeds: Sequence[int], placebo_ids: list[int] | None = None,
                    oracle_ids: list[int] | None = None) -> SiteDraws:
    """Draw the erring turn once per seed from each context (the same seeds on every arm: common
    random numbers, so the arms differ only by their context) and check each draw."""
    async def one(ids: list[int], s: int) -> bool:
        return await check(*(await draw(ids, s)))

    async def arm(ids: list[int]) -> list[bool]:
        return list(await asyncio.gather(*(one(ids, s) for s in seeds)))  # together: an engine batches them

    maybe = lambda ids: arm(ids) if ids is not None else asyncio.sleep(0, [])  # noqa: E731
    return SiteDraws(env, kind, *await asyncio.gather(arm(hint_ids), arm(plain_ids), maybe(placebo_ids), maybe(oracle_ids)))


class LiftTracker:
    """In a run: every sampled site so far, by kind; its metrics are H per kind over the run so far."""

    def __init__(self, n_boot: int = 200) -> None:
        self.draws: dict[str, list[SiteDraws]] = {}
        self.n_boot = n_boot

    def add(self, site: SiteDraws) -> None:
        self.draws.setdefault(site.kind, []).append(site)

    def interval(self, kind: str) -> tuple[float, float] | None:
        draws = self.draws.get(kind)
        return bootstrap(draws, lift, self.n_boot) if draws else None

    def metrics(self) -> dict[str, float]:
        out = {}
        for kind, draws in sorted(self.draws.items()):
            lo, hi = bootstrap(draws, lift, self.n_boot)
            out |= {f"hint_lift/{kind}": lift(draws), f"hint_lift_lo/{kind}": lo, f"hint_lift_hi/{kind}": hi,
                    f"hint_lift_sites/{kind}": float(len(draws))}
        return out


class LiftGate:
    """Which error kinds the distill channel spends gradient on: a kind is closed where its measured
    lift's interval does not lie above 0 (it contains 0, or the hint hurts). `measured`: kind -> (lo, hi)
    from a benchmarks/hint_lift.py result; `tracker`: the run's own measurement, judged once a kind has
    `min_sites` sampled sites. A kind measured nowhere stays open."""

    def __init__(self, measured: dict[str, tuple[float, float]] | None = None, tracker: LiftTracker | None = None,
                 min_sites: int = 8) -> None:
        self.measured, self.tracker, self.min_sites = dict(measured or {}), tracker, min_sites

    @classmethod
    def from_result(cls, result: dict, env: str, **kw: Any) -> "LiftGate":
        """From benchmarks/hint_lift.py's JSON: its `summary[env][kind]["lift_ci"]`."""
        rows = result["summary"].get(env, {})
        return cls({k: tuple(r["lift_ci"]) for k, r in rows.items() if k != "all"}, **kw)

    def interval(self, kind: str) -> tuple[float, float] | None:
        if self.tracker is not None and len(self.tracker.draws.get(kind, [])) >= self.min_sites:
            return self.tracker.interval(kind)
        return self.measured.get(kind)

    def open(self, kind: str) -> bool:
        ci = self.interval(kind)
        return ci is None or ci[0] > 0

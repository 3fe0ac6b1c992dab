"""Hint lift on tool-calc: how much more often the model gets an error turn right with the hint.

    uv run python benchmarks/hint_lift.py --model outputs/distill-ab/agent [--name tiny] [--rollouts 96]
                                          [--k 16] [--max-sites 64] [--placebo shuffle] [--oracle]
                                          [--device cpu] [--results DIR]

Samples `--rollouts` tool-calc episodes (two-digit questions, 3 turns, 48 tokens a turn, temperature
1, fixed seeds) from the model in-process (the embedded engine), finds their error turns, and at
each (up to `--max-sites`) draws the erring turn `--k` times from the student's context, from the
hinted teacher's (the run's hint chain: the environment's hint, then the template), from a placebo
teacher's (`--placebo`: the hint's words shuffled, another kind's hint, or its words without the calls it
quotes, or a sentence saying nothing: `blank`) and, with `--oracle`, from
a teacher shown the correct turn; the same k seeds on every arm. Each draw is scored by
tool-calc's own turn check (orchestrator/hint_lift.py). Prints, per error kind, P(valid) with and
without the hint, H = P(valid | hint) − P(valid | no hint) with its 95% bootstrap interval over
sites, the placebo's (and oracle's) H, and the per-token gap log p_T(y) − log p_S(y) on the erring
turn's own tokens (mean over the turn, and its minimum: the token the hint most rejects). Writes
<results>/hint_lift_<name>.json (hint_lift.json without `--name`) stamped with machine, date and
commit; its `summary` is what
`orchestrator.distill.gate.lift_file` reads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from composer_prime.config.sampling import SamplingParams  # noqa: E402
from composer_prime.contract.inference import Completion  # noqa: E402
from composer_prime.env_runtime.tasksets import load_tasks  # noqa: E402
from composer_prime.orchestrator.hint_arms import PLACEBOS, PlaceboHinter  # noqa: E402
from composer_prime.orchestrator.hint_lift import draw_site, summarise, turn_valid  # noqa: E402
from composer_prime.orchestrator.hints import HintContext, OracleHinter, make_hinter  # noqa: E402
from composer_prime.orchestrator.rollouts import rollout  # noqa: E402
from composer_prime.orchestrator.teachers import history_before, teacher_view  # noqa: E402
from support.cli import stamp  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARGS = {"max_operand": 99, "num_tasks": 2000}  # the A/B's questions (train split)


class LocalClient:
    """The orchestrator's client seam (`generate`) over an in-process embedded engine."""

    def __init__(self, engine) -> None:
        self.engine = engine

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        g = await self.engine.generate(prompt_ids, sampling)
        return Completion(g.token_ids, g.logprobs, g.finish_reason, 0, "local")


async def gap(engine, teacher, student_ids: list[int]) -> tuple[float, float]:
    """(mean, min) over the erring turn's tokens y of log p_T(y) − log p_S(y)."""
    t = await engine.score(teacher.input_ids[: teacher.start + teacher.length], teacher.start, 1)
    s = await engine.score(student_ids[: teacher.student_start + teacher.length], teacher.student_start, 1)
    d = [a - b for a, b in zip(t.token_logprobs, s.token_logprobs)]
    return sum(d) / len(d), min(d)


async def measure(a: argparse.Namespace, model: str) -> tuple[list, dict]:
    from transformers import AutoTokenizer

    from composer_prime.inference.engines.hf.engine import HFEngine

    tok = AutoTokenizer.from_pretrained(model)
    engine = HFEngine(model, "hint-lift", max_model_len=512, max_batch=64, device=a.device)
    await engine.start()
    tasks = load_tasks("tool-calc", ARGS)
    sampling = SamplingParams(max_tokens=48, temperature=1.0)
    client, sem = LocalClient(engine), asyncio.Semaphore(64)
    t0 = time.time()
    rollouts = await asyncio.gather(*(rollout(client, tok, "tool-calc", tasks[i % len(tasks)], sampling, 256, 3,
                                              a.seed * 100_000 + i, sem) for i in range(a.rollouts)))
    real = make_hinter(["env", "template"], {}, None, None, 1.0, None)
    arms = {"placebo": PlaceboHinter(real, a.placebo)} | ({"oracle": OracleHinter()} if a.oracle else {})
    params = sampling.or_eos(tok.eos_token_id)

    async def draw(ids: list[int], seed: int) -> tuple[str, str]:
        g = await engine.generate(ids, params.model_copy(update={"seed": seed}))
        return tok.decode(g.token_ids, skip_special_tokens=True), g.finish_reason

    sites = [(r, s) for r in rollouts if not r.dropped for s in r.sites][: a.max_sites]
    print(f"{len(rollouts)} rollouts ({time.time() - t0:.0f} s): {sum(len(r.sites) for r in rollouts)} error turns; "
          f"measuring {len(sites)}, {a.k} draws per arm", flush=True)

    async def one(j: int, r, site):
        turn, p = r.turns[site.turn], len(r.prompt_ids)
        ids, history = r.prompt_ids + r.completion_ids, history_before(r.opening, r.turns, site.turn)
        ctx = HintContext(history, turn.text, r.tools, r.task)
        views = {}
        for arm, hinter in {"hint": real, **arms}.items():
            text = await hinter(site, ctx)
            views[arm] = teacher_view(tok, ids, p + turn.start, p + turn.end, history, text) if text else None
        if views["hint"] is None:
            return None

        async def check(text: str, finish: str) -> bool:
            return await turn_valid(text, finish, r.tools, await r.task.open_session(), r.task.error_rules)

        ctx_ids = lambda arm: views[arm].input_ids[: views[arm].start] if views.get(arm) else None  # noqa: E731
        seeds = range(j * 1000, j * 1000 + a.k)
        d = await draw_site("tool-calc", site.kind, ids[: p + turn.start], ctx_ids("hint"), draw, check, seeds,
                            ctx_ids("placebo"), ctx_ids("oracle"))
        d.gap_mean, d.gap_min = await gap(engine, views["hint"], ids)
        return d

    draws = [d for d in await asyncio.gather(*(one(j, r, s) for j, (r, s) in enumerate(sites))) if d is not None]
    await engine.stop()
    info = {"rollouts": len(rollouts), "reward": sum(r.reward for r in rollouts) / len(rollouts),
            "error_turns": sum(len(r.sites) for r in rollouts), "seconds": time.time() - t0}
    return draws, info


def fmt_ci(row: dict, key: str, ci: str) -> str:
    return f"{row[key]:+.3f} [{row[ci][0]:+.3f}, {row[ci][1]:+.3f}]" if key in row else "-"


def table(summary: dict) -> str:
    lines = ["| error kind | sites | P(valid) no hint | P(valid) hint | H [95% CI] | placebo H [95% CI] "
             "| oracle H [95% CI] | gap mean / min (nats) |", "|---|---|---|---|---|---|---|---|"]
    for kind, r in summary["tool-calc"].items():
        gap = f"{r['gap_mean']:+.2f} / {r['gap_min']:+.2f}" if "gap_mean" in r else "-"
        lines.append(f"| {kind} | {r['sites']} | {r['p_plain']:.3f} | {r['p_hint']:.3f} | {fmt_ci(r, 'lift', 'lift_ci')} "
                     f"| {fmt_ci(r, 'placebo_lift', 'placebo_ci')} | {fmt_ci(r, 'oracle_lift', 'oracle_ci')} | {gap} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a warm-started model directory (or tiny, smollm2-135m)")
    p.add_argument("--name", help="the result's name: <results>/hint_lift_<name>.json (default hint_lift.json)")
    p.add_argument("--rollouts", type=int, default=96)
    p.add_argument("--k", type=int, default=16, help="draws per site and arm (the same seeds on every arm)")
    p.add_argument("--max-sites", type=int, default=64)
    p.add_argument("--placebo", choices=list(PLACEBOS), default="shuffle")
    p.add_argument("--oracle", action="store_true", help="also a teacher shown the correct turn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--boot", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--device", default="cpu")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    a = p.parse_args()
    if a.k < 1 or a.rollouts < 1:
        p.error("--k and --rollouts must be at least 1")
    from composer_prime.model.resolve import resolve_model

    draws, info = asyncio.run(measure(a, resolve_model(a.model)))
    summary = summarise(draws, a.boot, a.seed)
    if not summary:
        sys.exit("no error turn was hinted: nothing to measure")
    print(table(summary))
    a.results.mkdir(parents=True, exist_ok=True)
    out = a.results / (f"hint_lift_{a.name}.json" if a.name else "hint_lift.json")
    out.write_text(json.dumps({**stamp(a.device), "model": a.model, "k": a.k, "placebo": a.placebo, **info,
                               "summary": summary, "sites": [d.__dict__ for d in draws]}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

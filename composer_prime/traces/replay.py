"""`composer-prime traces replay STEPS --teachers T.toml --out DIR`: teachers re-decide every step.

For each ingested step, teachers propose the next action from the same history and tools
(teachers.py); where enough of them agree against the student, the step becomes a preference
pair (pairs.py). Written to DIR:

    cache/<hash>.json   one teacher answer, keyed by sha256(history, tools, teacher's endpoint
                        and model, sampling): a rerun after a crash pays for no call twice
    ledger.jsonl        one line per paid call: teacher, step, tokens in/out, dollars
    pairs.jsonl         the pairs, rewritten after every window of steps
    summary.json        totals per teacher and per trace, calls, cache hits, failures, spend

Gating, measurable against asking everyone everything (`--gating all`): `tiered` asks teachers
cheapest first and stops as soon as the outcome is decided (enough agree with each other against
the student, or too few teachers are left to outvote the student's supporters). `--gate-url`
asks only about steps the student was unsure of (gate.py: its own NLL of its action, above
`--gate-nll`), counted as `gated_out`.
`--budget-usd` stops cleanly before a call that could pass the cap; what was bought is kept.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import sys
from collections import Counter, defaultdict
from pathlib import Path

import httpx

from composer_prime.traces.gate import StudentGate
from composer_prime.traces.pairs import key, make_pair
from composer_prime.traces.record import Step, read_steps
from composer_prime.traces.teachers import Answer, Teacher, TeacherError, TeachersFile, load_teachers
from composer_prime.utils.fs import check_writable_dir
from composer_prime.utils.progress import Progress

log = logging.getLogger(__name__)


class Replay:
    def __init__(self, cfg: TeachersFile, out: Path, gating: str = "all", budget_usd: float | None = None,
                 min_agree: int = 2, gate: StudentGate | None = None) -> None:
        self.cfg, self.out, self.gating, self.budget, self.min_agree = cfg, out, gating, budget_usd, min_agree
        self.gate = gate
        (out / "cache").mkdir(parents=True, exist_ok=True)
        self.ledger = (out / "ledger.jsonl").open("a", encoding="utf-8")
        # the budget counts every run into this directory; the summary says what this run paid too
        self.spent = sum(json.loads(ln)["usd"] for ln in (out / "ledger.jsonl").read_text().splitlines() if ln.strip())
        self.spent_before = self.spent
        self.stats: Counter = Counter()
        self.per_teacher: dict[str, Counter] = defaultdict(Counter)
        self.per_trace: dict[str, float] = defaultdict(float)
        self.stopped = False
        self.reserved = 0.0  # dollars of calls in flight, counted against the budget

    def cache_path(self, t: Teacher, step: Step) -> Path:
        # the teacher by name and model, not endpoint: a checkpoint served again on another port is the same teacher
        state = json.dumps([step.messages, step.tools, t.cfg.name, t.cfg.model, t.sampling], sort_keys=True)
        return self.out / "cache" / f"{hashlib.sha256(state.encode()).hexdigest()}.json"

    async def answer(self, t: Teacher, step: Step) -> Answer | None:
        """A teacher's answer: cached, or paid for and recorded (None: failed, or over budget)."""
        path = self.cache_path(t, step)
        if path.exists():
            self.stats["cache_hits"] += 1
            return Answer(**json.loads(path.read_text()))
        reserve = t.cost(*_estimate(step, self.cfg.max_tokens))  # held while the call is in flight
        if self.stopped or (self.budget is not None and self.spent + self.reserved + reserve > self.budget):
            self.stopped = True
            return None
        self.reserved += reserve
        try:
            a = await t.ask(step)
        except TeacherError:
            self.stats["failed_calls"] += 1
            self.per_teacher[t.cfg.name]["failed"] += 1
            return None
        finally:
            self.reserved -= reserve
        usd = t.cost(a.tokens_in, a.tokens_out)
        self.spent += usd
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(a.__dict__))
        tmp.replace(path)  # the answer is kept before it is counted: a crash never loses a paid call
        self.ledger.write(json.dumps({"teacher": t.cfg.name, "step": step.id, "tokens_in": a.tokens_in,
                                      "tokens_out": a.tokens_out, "usd": usd}) + "\n")
        self.ledger.flush()
        self.stats["calls"] += 1
        self.per_teacher[t.cfg.name].update({"calls": 1, "tokens_in": a.tokens_in, "tokens_out": a.tokens_out})
        self.per_teacher[t.cfg.name]["usd"] += usd
        self.per_trace[step.source] += usd
        return a

    async def step(self, teachers: list[Teacher], step: Step) -> dict[str, dict]:
        if self.gate is not None and not await self.gate.unsure(self.http, step):
            self.stats["gated_out"] += 1
            return {}
        if self.gating == "all":
            got = await asyncio.gather(*(self.answer(t, step) for t in teachers))
            return {t.cfg.name: a.action for t, a in zip(teachers, got) if a is not None}
        proposals: dict[str, dict] = {}
        student = key(step.action)
        for i, t in enumerate(sorted(teachers, key=lambda t: t.cfg.price_in + t.cfg.price_out)):
            a = await self.answer(t, step)
            if a is not None:
                proposals[t.cfg.name] = a.action
            votes = Counter(key(p) for p in proposals.values())
            left = len(teachers) - i - 1
            against = max((n for k, n in votes.items() if k != student), default=0)
            if against >= self.min_agree and against > votes[student] + left:
                break  # decided for a pair: the others cannot change the majority
            if against + left < self.min_agree or votes[student] > against + left:
                break  # decided against a pair
        return proposals

    async def run(self, steps: list[Step], window: int = 16) -> list[dict]:
        """Steps `window` at a time (each teacher's own concurrency bounds its calls); pairs saved after each window."""
        pairs: list[dict] = []
        async with httpx.AsyncClient() as http:
            self.http = http  # the student gate's client too
            teachers = [Teacher(c, http, self.cfg.max_tokens, self.cfg.temperature) for c in self.cfg.teachers]
            models = {c.name: c.model for c in self.cfg.teachers}
            with Progress("replay", len(steps), "states") as progress:
                for i in range(0, len(steps), window):
                    chunk = steps[i:i + window]
                    proposals = await asyncio.gather(*(self.step(teachers, s) for s in chunk))
                    if self.stopped:  # a state that lost a vote to the cap is not judged: rerun with more budget
                        break
                    self.stats["states"] += len(chunk)
                    pairs += [p for s, got in zip(chunk, proposals) if (p := make_pair(s, got, models, self.min_agree))]
                    write_jsonl(pairs, self.out / "pairs.jsonl")
                    progress.advance(len(chunk), note=f"{self.stats['calls']} teacher calls, {self.stats['cache_hits']} "
                                     f"cache hits, {self.stats['failed_calls']} failed | ${self.spent:.4f} | {len(pairs)} pairs")
        if self.stopped:
            log.warning(f"budget of ${self.budget:.4f} reached after {self.stats['states']} of {len(steps)} states; stopped")
        self.ledger.close()
        write_jsonl(pairs, self.out / "pairs.jsonl")
        return pairs

    def summary(self, pairs: list[dict], total: int) -> dict:
        return {"states": self.stats["states"], "of": total, "pairs": len(pairs), "circular": sum(p["circular"] for p in pairs),
                "calls": self.stats["calls"], "cache_hits": self.stats["cache_hits"], "failed_calls": self.stats["failed_calls"],
                "gated_out": self.stats["gated_out"],
                "usd": self.spent - self.spent_before, "usd_all_runs": self.spent, "stopped_by_budget": self.stopped,
                "gating": self.gating,
                "teachers": {n: {"usd": 0.0, **c} for n, c in self.per_teacher.items()},
                "per_trace_usd": dict(self.per_trace)}


def _estimate(step: Step, max_tokens: int) -> tuple[int, int]:
    """An upper bound of a call's tokens for the budget check: 4 characters per token, full answer."""
    return len(json.dumps(step.messages)) // 4 + 1, max_tokens


def write_jsonl(rows: list[dict], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    tmp.replace(path)


def run(args: argparse.Namespace) -> int:
    try:
        steps = read_steps(Path(args.steps))
        cfg = load_teachers(Path(args.teachers))
    except ValueError as e:  # a missing or malformed file: one line naming it
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        check_writable_dir(Path(args.out))  # before a call is paid for
    except OSError as e:
        print(f"error: --out: {e}", file=sys.stderr)
        return 2
    gate = None
    if args.gate_url:
        from transformers import AutoTokenizer

        from composer_prime.model.resolve import resolve_model

        try:
            gate = StudentGate(args.gate_url, AutoTokenizer.from_pretrained(resolve_model(args.gate_model)), args.gate_nll)
        except (OSError, ValueError) as e:
            print(f"error: --gate-model {args.gate_model}: {e}", file=sys.stderr)
            return 2
    replay = Replay(cfg, Path(args.out), args.gating, args.budget_usd, args.min_agree, gate)
    pairs = asyncio.run(replay.run(steps))
    summary = replay.summary(pairs, len(steps))
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{summary['states']}/{len(steps)} states, {len(pairs)} pairs ({summary['circular']} circular) | "
          f"{summary['calls']} calls, {summary['cache_hits']} cache hits, {summary['failed_calls']} failed | ${summary['usd']:.4f} "
          f"(${summary['usd_all_runs']:.4f} over every run into {args.out})")
    for name, c in summary["teachers"].items():
        print(f"  {name}: {c.get('calls', 0)} calls, {c.get('tokens_in', 0)} in / {c.get('tokens_out', 0)} out tokens, "
              f"${c['usd']:.4f}, {c.get('failed', 0)} failed")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("replay", help="teachers re-decide every ingested step; disagreement becomes preference pairs")
    p.add_argument("steps", help="steps from `traces ingest` (JSONL)")
    p.add_argument("--teachers", required=True, help="the teachers file (TOML; see composer_prime/traces/teachers.py)")
    p.add_argument("--out", required=True, help="directory: cache, ledger, pairs.jsonl, summary.json")
    p.add_argument("--gating", choices=("all", "tiered"), default="all", help="ask every teacher, or cheapest first until decided")
    p.add_argument("--budget-usd", type=float, default=None, help="stop cleanly before spending more than this")
    p.add_argument("--min-agree", type=int, default=2, help="teachers that must agree against the student for a pair")
    p.add_argument("--gate-url", default=None, help="our inference server serving the student: ask only where it was unsure")
    p.add_argument("--gate-model", default="tiny", help="the student served there (its tokenizer renders the steps)")
    p.add_argument("--gate-nll", type=float, default=1.0, help="nats per token of its own action above which it was unsure")
    p.set_defaults(func=run)
    return p

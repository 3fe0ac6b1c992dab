"""Runs of one benchmark side by side (`--parallel N`): each arm and seed is an `rl` run of its own
(its own output directory, ports and log), at most N at a time, so that several share one GPU.

Each run is a support/timed.py `Running`, started from this process's main thread (a child's
parent-death signal follows the thread that started it, so no worker thread may start one) and
polled. As each ends, a line says so with its wall time; a failed run's line names its log, and the
others go on: the caller exits non-zero at the end (`exit_if_failed`). Each run's record keeps its
start and end (epoch seconds), so that the overlap of the runs can be read back, and its wall time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from composer_prime.utils.progress import Progress

from .spread import spread
from .timed import Running

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Job:
    """One run: its name (as the tables show it), command, log, wall-clock budget (None: it runs to
    its end; seconds: then it is stopped, which for a run on a time budget is success) and the
    environment added to this process's."""

    name: str
    cmd: list[str]
    log: Path
    budget: float | None = None
    env: dict[str, str] = field(default_factory=dict)


def record(job: Job, run: Running) -> dict:
    ok = run.budget_ran_out or run.returncode == 0
    start, end = round(run.start, 2), round(run.end, 2)
    return {"name": job.name, "status": "ok" if ok else "failed", "returncode": run.returncode, "log": str(job.log),
            "start": start, "end": end, "wall_s": round(end - start, 1),
            "peak_rss_mb": {p: round(b / 2**20) for p, b in run.watch.peaks.items() if p}}


def run_all(jobs: list[Job], parallel: int, label: str, done: Callable[[Job, dict], str] | None = None) -> list[dict]:
    """Run `jobs`, at most `parallel` at once, started in their order; returns their records in that
    order. `done(job, record)`, called as a run ends well, gives the rest of its line (its figures);
    if it raises, the run counts as failed with that message (a run that ended without results)."""
    pending, running, records = list(jobs), {}, {}
    if not jobs:  # every run reused: no progress to show
        return []
    with Progress(label, len(jobs), "runs") as progress:
        try:
            while pending or running:
                while pending and len(running) < parallel:
                    job = pending.pop(0)
                    running[job.name] = (job, Running(job.cmd, ROOT, job.budget, job.log, env=job.env))
                for name, (job, run) in list(running.items()):
                    if not run.poll():
                        continue
                    del running[name]
                    records[name] = r = record(job, run)
                    note = ""
                    if r["status"] == "ok" and done is not None:
                        try:
                            note = done(job, r)
                        except (Exception, SystemExit) as e:  # noqa: BLE001 (its message is the run's failure)
                            r |= {"status": "failed", "why": str(e)}
                    if r["status"] == "ok":
                        progress.echo(f"{label}: {name} done in {r['wall_s']:.0f} s" + (f": {note}" if note else ""),
                                      file=sys.stdout)
                    else:
                        progress.echo(f"{label}: {name} FAILED after {r['wall_s']:.0f} s ("
                                      + (r.get("why") or f"exit code {r['returncode']}") + f"); log: {job.log}")
                    progress.advance()
                time.sleep(0.2)
        except BaseException:  # interrupted: nothing this started may outlive it
            for _, run in running.values():
                run.stop()
            raise
    return [records[j.name] for j in jobs]


def span(records: list[dict]) -> dict:
    """Wall time over the runs this invocation made (reused ones left out): each run's median and
    range, and from the first start to the last end."""
    ran = [r for r in records if r["status"] != "reused"]
    if not ran:
        return {}
    return {"run_wall_s": spread([r["wall_s"] for r in ran], 1),
            "elapsed_s": round(max(r["end"] for r in ran) - min(r["start"] for r in ran), 1)}


def table(records: list[dict], parallel: int) -> str:
    """Each run's status and wall time, its start and end in seconds from the first start."""
    t0 = min((r["start"] for r in records if r["status"] != "reused"), default=0.0)
    s = span(records)
    rows = [f"runs, at most {parallel} at once" + (f": {s['elapsed_s']:.0f} s from the first start to the last end; "
                                                  f"wall s per run median {s['run_wall_s']['median']:.0f} "
                                                  f"[{s['run_wall_s']['min']:.0f}, {s['run_wall_s']['max']:.0f}]"
                                                  if s else ""),
            "| run | status | wall s | start s | end s | log |", "|---|---|---|---|---|---|"]
    for r in records:
        times = (f"{r['start'] - t0:.0f} | {r['end'] - t0:.0f}" if r["status"] != "reused" else "(earlier) | ")
        rows.append(f"| {r['name']} | {r['status']} | {r['wall_s'] if r['wall_s'] is not None else '?'} | {times} | "
                    f"{r['log']} |")
    return "\n".join(rows)


def exit_if_failed(records: list[dict]) -> None:
    """One line naming each failed run's log, and exit code 1, if any failed."""
    if failed := [r for r in records if r["status"] == "failed"]:
        sys.exit(f"{len(failed)} of {len(records)} runs failed: " + ", ".join(f"{r['name']} (log: {r['log']})" for r in failed))

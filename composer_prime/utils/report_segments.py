"""A run's segments: each `rl` invocation that trained it, for a report of the whole run (issue 46).

A run stopped and continued with `--resume` is several segments; its metrics files hold every step
once (a resumed process rewinds the rows of the steps it redoes), but the resumed `rl` alone knew
only its own start, so its report took the resumed part's 142 s for the run's wall time (rollouts/s
inflated) and a step time across the stop (the stall and the pause before the resume in it).
`rl` records here, in `<output_dir>/segments.json`, when each segment started (and at which step)
and when it ended; the report sums their wall times and takes step times within a segment only.

    [{"start": 1795000000.0, "step": 0, "run": "3fa2c1d0", "end": 1795000412.5}, {"start": ..., "step": 20, ...}]

A segment whose `rl` was killed before it could write its end ends at its last metrics row.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from pathlib import Path

FILE = "segments.json"


def load(run_dir: Path) -> list[dict]:
    try:
        segments = json.loads((Path(run_dir) / FILE).read_text())
    except (OSError, ValueError):
        return []
    return segments if isinstance(segments, list) and all(isinstance(s, dict) and "start" in s for s in segments) else []


def _write(run_dir: Path, segments: list[dict]) -> None:
    path = Path(run_dir) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(segments))
    os.replace(tmp, path)


def begin(run_dir: Path, step: int | None, run: str | None, row_times: list[float], now: float | None = None) -> None:
    """A segment starts: the run's first (`step` None: a new run), or a resume at `step`. A resumed run with
    no record of its earlier segments (its first `rl` predates them) gets one from its metrics rows' times."""
    now = time.time() if now is None else now
    segments = load(run_dir) if step is not None else []
    if step is not None and not segments and (before := [t for t in row_times if t < now]):
        segments = [{"start": min(before), "step": 0, "run": run, "end": max(before)}]
    _write(run_dir, segments + [{"start": now, "step": step or 0, "run": run}])


def end(run_dir: Path, now: float | None = None) -> None:
    """The current (last) segment ends."""
    if segments := load(run_dir):
        segments[-1]["end"] = time.time() if now is None else now
        _write(run_dir, segments)


def wall_times(segments: list[dict], row_times: list[float]) -> list[float]:
    """Each segment's seconds: start to end, or to its last metrics row where its end was never written."""
    out = []
    for i, s in enumerate(segments):
        stop = segments[i + 1]["start"] if i + 1 < len(segments) else float("inf")
        end = s.get("end") or max([t for t in row_times if s["start"] <= t < stop], default=s["start"])
        out.append(max(0.0, end - s["start"]))
    return out


def index(segments: list[dict], t: float) -> int:
    """The segment a row written at time `t` belongs to (0 without segments)."""
    return max(0, bisect.bisect_right([s["start"] for s in segments], t) - 1)

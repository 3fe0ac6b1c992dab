"""Step directories: `<root>/step_<N>`, written by the trainer's checkpoints, the published weights,
SHARDCAST's followers and the volunteers' downloads. The one place their names are made and read.

A directory counts once its marker file is there (a checkpoint's DONE, published weights' STABLE),
so one half-written when its writer died is never read; a name that is not step_<digits>
(`step_3.tmp`, a stray `step_x`) is never a step.

A marker written by `rl`'s trainer names the run that wrote it (`{"step": N, "run": ID}`,
utils/run_dir.py): a run directory used again keeps the current run's steps, not an older run's
higher-numbered ones (issue 46: keep_last kept an old run's step_140 and step_150 and deleted the
new run's step_10 and step_20, and `--resume` continued the old run).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

NAME = re.compile(r"^step_(\d+)$")


def step_path(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step}"


def steps(root: Path, marker: str | None = None) -> list[tuple[int, Path]]:
    """The steps under `root`, oldest first, those holding `marker` only when it is given."""
    found = []
    for p in Path(root).glob("step_*"):
        m = NAME.match(p.name)
        if m and p.is_dir() and (marker is None or (p / marker).exists()):
            found.append((int(m.group(1)), p))
    return sorted(found)


def run_of(path: Path, marker: str) -> str | None:
    """The run id the step's marker names; None for a marker written before run ids, or by a writer
    that records none (SHARDCAST's followers write the bare step number)."""
    try:
        data = json.loads((Path(path) / marker).read_text())
    except (OSError, ValueError):
        return None
    run = data.get("run") if isinstance(data, dict) else None
    return run if isinstance(run, str) else None


def ours(path: Path, marker: str, run: str | None) -> bool:
    """Whether the step belongs to run `run`: its marker names it, or names no run (written before run
    ids: adopted by the run that resumes it). With `run` None every step is ours."""
    return run is None or run_of(path, marker) in (run, None)


def latest(root: Path, marker: str | None = None, run: str | None = None) -> tuple[int, Path] | None:
    """The newest step (holding `marker`), of run `run` when it is given (see `ours`)."""
    found = [(s, p) for s, p in steps(root, marker) if marker is None or ours(p, marker, run)]
    return found[-1] if found else None


def prune(root: Path, keep: int, marker: str | None = None, protect: int | None = None, run: str | None = None) -> None:
    """Delete all but the newest `keep` steps (those holding `marker`), never `protect`; keep <= 0 keeps all.
    With `run`, the newest `keep` of that run are kept and every other step (another run's, or one from
    before run ids) is deleted: an older run's step_150 never outlives the current run's step_20."""
    found = steps(root, marker)
    if run is not None and marker is not None:
        mine = [(s, p) for s, p in found if run_of(p, marker) == run]
        drop = [(s, p) for s, p in found if run_of(p, marker) != run] + (mine[:-keep] if keep > 0 else [])
    else:
        drop = found[:-keep] if keep > 0 else []
    for step, path in drop:
        if step != protect:
            shutil.rmtree(path, ignore_errors=True)

"""Step directories: `<root>/step_<N>`, written by the trainer's checkpoints, the published weights,
SHARDCAST's followers and the volunteers' downloads. The one place their names are made and read.

A directory counts once its marker file is there (a checkpoint's DONE, published weights' STABLE),
so one half-written when its writer died is never read; a name that is not step_<digits>
(`step_3.tmp`, a stray `step_x`) is never a step.
"""

from __future__ import annotations

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


def latest(root: Path, marker: str | None = None) -> tuple[int, Path] | None:
    found = steps(root, marker)
    return found[-1] if found else None


def prune(root: Path, keep: int, marker: str | None = None, protect: int | None = None) -> None:
    """Delete all but the newest `keep` steps (those holding `marker`), never `protect`; keep <= 0 deletes none."""
    for step, path in steps(root, marker)[:-keep] if keep > 0 else []:
        if step != protect:
            shutil.rmtree(path, ignore_errors=True)

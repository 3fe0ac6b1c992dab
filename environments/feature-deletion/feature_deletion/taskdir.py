"""Write a task set to disk: staged in a hidden sibling directory, manifest last, then renamed.

An interrupted build leaves at most `.<out>.partial-*` behind (removed on the way out when it
can be), never a directory with a manifest that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from feature_deletion.baseline import BuildError, copy_tree

MANIFEST = "manifest.json"
TASK_FILE = "task.json"


def check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise BuildError(f"--out exists and is not a directory: {out}")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise BuildError(f"--out is not empty: {out} (pass --force to replace it)")


def staging(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "tasks").mkdir(parents=True)
    return tmp


def dump(obj: object) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def write_task(stage: Path, task: dict, pristine: Path, broken: dict[str, str]) -> None:
    """repo/: the pristine tree with `broken` applied; solution/: the original changed files."""
    d = stage / "tasks" / task["id"]
    copy_tree(pristine, d / "repo")
    for rel, text in broken.items():
        (d / "solution" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(pristine / rel, d / "solution" / rel)
        (d / "repo" / rel).write_bytes(text.encode("utf-8"))
    (d / TASK_FILE).write_text(dump(task))


def load_task(task_dir: Path) -> dict:
    return json.loads((Path(task_dir) / TASK_FILE).read_text())


def finish(stage: Path, out: Path, manifest: dict, force: bool) -> None:
    (stage / MANIFEST).write_text(dump(manifest))  # last: its presence marks a complete set
    if out.exists():
        check_out(out, force)
        shutil.rmtree(out)
    stage.rename(out)

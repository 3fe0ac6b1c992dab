"""What a red-team run checks on the host: the task set and a sentinel directory unchanged, no
file created where an escape would put it, no sandboxed process outliving its run; and the caches
a careless generator would leave in a task (to show that stripping them is what stops the attack).
"""

from __future__ import annotations

import hashlib
import json
import os
import py_compile
import sys
import time
import zlib
from pathlib import Path

from feature_deletion.taskdir import load_task


def tree_digest(root: Path) -> str:
    """Names (files, dirs, links) and file contents of a tree."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        if p.is_symlink():
            h.update(b"L" + os.readlink(p).encode())
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def sandbox_pids() -> set[int]:
    """Processes in a pid namespace other than ours (sandboxed ones, running or leaked)."""
    own = os.readlink("/proc/self/ns/pid")
    out = set()
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/pid") != own:
                out.add(int(entry))
        except OSError:
            pass  # gone while we looked
    return out


def leaked_sandbox_pids() -> set[int]:
    """Sandboxed processes with no live sandbox run above them: a run in progress (anyone's) has
    its helper, in our namespace, among the ancestors; a leaked process was orphaned to pid 1."""
    own = os.readlink("/proc/self/ns/pid")
    out = set()
    for pid in sandbox_pids():
        try:
            p = pid
            while p > 1 and os.readlink(f"/proc/{p}/ns/pid") != own:
                p = _ppid(p)
            if p <= 1:
                out.add(pid)
        except (OSError, ValueError, IndexError):
            pass  # gone while we looked
    return out


class HostGuard:
    """Snapshot what a sandboxed run must not change; `check()` asserts nothing did."""

    def __init__(self, watched: list[Path], forbidden: list[Path]) -> None:
        self.watched, self.forbidden = watched, forbidden
        self.digests = {p: tree_digest(p) for p in watched}

    def check(self) -> None:
        for p, digest in self.digests.items():
            assert tree_digest(p) == digest, f"{p} changed"
        for p in self.forbidden:
            assert not os.path.lexists(p), f"{p} was created on the host"
        deadline = time.monotonic() + 5
        while (left := leaked_sandbox_pids()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"sandboxed processes outlived their run: {sorted(left)}"

    def cleanup(self) -> None:
        for p in self.forbidden:
            if os.path.lexists(p) and not os.path.isdir(p):
                os.unlink(p)


def plant_caches(task_dir: Path) -> list[str]:
    """Leave in the task's repo/ what a careless generator would: an unchecked-hash .pyc of the
    original (Python loads it whatever the source says), the original in .git objects, and in
    type-checker and linter caches. Returns the planted paths (relative to repo/)."""
    task = load_task(task_dir)
    repo, original = task_dir / "repo", task_dir / "solution" / task["file"]
    text = original.read_bytes()
    rel = Path(task["file"])
    pyc = rel.parent / "__pycache__" / f"{rel.stem}.{sys.implementation.cache_tag}.pyc"
    (repo / pyc).parent.mkdir(parents=True, exist_ok=True)
    py_compile.compile(str(original), cfile=str(repo / pyc), dfile=str(repo / rel),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH, doraise=True)
    blob = b"blob %d\0" % len(text) + text
    digest = hashlib.sha1(blob).hexdigest()
    files = {
        f".git/objects/{digest[:2]}/{digest[2:]}": zlib.compress(blob), ".git/HEAD": b"ref: refs/heads/main\n",
        f".mypy_cache/3.11/{rel.with_suffix('.data.json')}": json.dumps({"source": text.decode()}).encode(),
        f".ruff_cache/0.5.0/{digest}": text, f".pytype/pyi/{rel.stem}.py": text,
    }
    for path, data in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(data)
    return [pyc.as_posix(), *files]

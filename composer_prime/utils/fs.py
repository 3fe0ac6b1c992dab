"""Checks that a path can be used before a process starts work that needs it, and one-time builds.

A run that finds out after an hour of training that it cannot write its output directory has
lost the hour; these run at start-up (and in a dry run) and say in one line what is wrong.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path


def check_writable_dir(path: Path) -> None:
    """Raise OSError unless `path` is, or can be created as, a directory this process can write."""
    path = Path(path).expanduser()
    probe = path
    while not probe.exists():  # the nearest existing ancestor decides whether the rest can be created
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise NotADirectoryError(f"{probe} is not a directory" + ("" if probe == path else f" (on the way to {path})"))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PermissionError(f"{probe} is not writable" + ("" if probe == path else f" (on the way to {path})"))


def check_writable_file(path: Path) -> None:
    """Raise OSError unless `path` can be written as a file: not a directory, in a directory this
    process can write or create."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; name a file")
    check_writable_dir(path.parent)


def check_readable_data(path: Path) -> None:
    """Raise OSError unless `path` is a readable file (JSONL) or a saved `datasets` directory."""
    p = Path(path).expanduser()
    _check_readable(p, directory=p.is_dir())
    if p.is_dir() and not (p / "dataset_info.json").is_file():
        raise IsADirectoryError(f"{p} is a directory but not a saved dataset (no dataset_info.json)")


def check_readable_dir(path: Path) -> None:
    """Raise OSError unless `path` is a directory this process can read."""
    _check_readable(Path(path).expanduser(), directory=True)


def _check_readable(path: Path, directory: bool) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{'directory' if directory else 'file'} not found: {path}")
    if path.is_dir() != directory:
        kind = "directory" if directory else "file"
        raise (NotADirectoryError if directory else IsADirectoryError)(f"{path} is not a {kind}")
    if not os.access(path, os.R_OK | (os.X_OK if directory else 0)):
        raise PermissionError(f"{path} is not readable")


def built_once(out: Path, build: Callable[[Path], None]) -> Path:
    """`out`, built by `build(tmp)` the first time any process asks for it; `out/READY` marks it done.

    Two processes starting on a fresh machine at once (two runs, or test workers) would otherwise both
    build, and the second's replace would pull the directory from under the first's readers: an
    exclusive lock beside `out` makes the second wait and then find it built. `build` writes `tmp`
    (READY included) and the rename is atomic, so a crash never leaves a half-written `out`."""
    if (out / "READY").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        if (out / "READY").exists():
            return out
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            build(tmp)
            if not (tmp / "READY").exists():
                raise RuntimeError(f"building {out.name} wrote no READY marker")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(out, ignore_errors=True)  # a stale, unmarked directory from before
        os.replace(tmp, out)
    return out

"""The environment's bytecode, compiled once by the install step rather than by every `uv run` (issue 46).

With `compile-bytecode = true` in pyproject's `[tool.uv]`, uv compiles (or checks) all of
site-packages at every sync, and `uv run` syncs before each command even when it installs nothing:
26,339 files checked, 1 to 11 s before every command on a loaded 2-core machine (0.2 s without).
uv has no setting that compiles only what it installed, so the setting is gone and `composer-prime
toploc install`, the step every install target ends with, compiles site-packages here instead.
Compiled it must be: where PYTHONDONTWRITEBYTECODE is set (this machine kind) nothing is cached
at import, and each process would compile torch and transformers again (17 s of a 39 s `rl --dry-run`).
A later `uv sync` or `uv run --extra X` that installs packages leaves those uncompiled until the
install step runs again.
"""

from __future__ import annotations

import compileall
import os
import sysconfig
import time
from pathlib import Path


def compile_site(site: Path | None = None, workers: int = 0) -> tuple[bool, float]:
    """Compile every module under `site` (this interpreter's site-packages) that has no up-to-date .pyc
    (a checked file costs a stat: about a second for a compiled environment); (all compiled, seconds).
    `workers` 0: one process per core."""
    site = Path(site or sysconfig.get_paths()["purelib"])
    start = time.monotonic()
    ok = compileall.compile_dir(str(site), quiet=2, workers=workers or (os.cpu_count() or 1))
    return bool(ok), time.monotonic() - start

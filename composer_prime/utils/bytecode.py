"""The environment's bytecode, compiled once by the install step rather than by every `uv run` (issue 46).

With `compile-bytecode = true` in pyproject's `[tool.uv]`, uv compiles (or checks) all of
site-packages at every sync, and `uv run` syncs before each command even when it installs nothing:
26,339 files checked, 1 to 11 s before every command on a loaded 2-core machine (0.2 s without).
uv has no setting that compiles only what it installed, so the setting is gone and `composer-prime
toploc install`, the step every install target ends with, compiles site-packages here instead.
Compiled it must be: where PYTHONDONTWRITEBYTECODE is set (this machine kind) nothing is cached
at import, and each process would compile torch and transformers again (17 s of a 39 s `rl --dry-run`).
A later `uv sync` or `uv run --extra X` that installs packages leaves those uncompiled until the
install step runs again. Packages installed editable (this project, its environments: `uv sync`
installs them so) live outside site-packages, named by a `.pth` file's directory line; they are
compiled too (`editable_packages`), or every process of a fresh clone compiles what it imports of
them again (about 0.9 s of CPU for all of composer_prime, 2026-11-28).
"""

from __future__ import annotations

import compileall
import os
import sysconfig
import time
from pathlib import Path


def editable_packages(site: Path) -> list[Path]:
    """The packages importable from the directories that `site`'s .pth files add to sys.path (lines
    that are directories; a line starting with `import` is code, not a path)."""
    roots: list[Path] = []
    for pth in sorted(site.glob("*.pth")):
        for line in pth.read_text(errors="replace").splitlines():
            root = Path(line.strip())
            if line.strip() and not line.startswith(("import ", "import\t", "#")) and root.is_dir() and root not in roots:
                roots.append(root)
    return [d for root in roots for d in sorted(root.iterdir()) if (d / "__init__.py").is_file()]


def compile_site(site: Path | None = None, workers: int = 0) -> tuple[bool, float]:
    """Compile every module under `site` (this interpreter's site-packages), and in the packages installed
    editable from it, that has no up-to-date .pyc (a checked file costs a stat: about a second for a
    compiled environment); (all compiled, seconds). `workers` 0: one process per core."""
    site = Path(site or sysconfig.get_paths()["purelib"])
    start = time.monotonic()
    workers = workers or (os.cpu_count() or 1)
    ok = True
    for where in (site, *editable_packages(site)):
        ok = compileall.compile_dir(str(where), quiet=2, workers=workers) and ok
    return bool(ok), time.monotonic() - start

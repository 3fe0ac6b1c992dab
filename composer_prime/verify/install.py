"""`composer-prime toploc install`: make TOPLOC (toploc 0.1.6, a C++ torch extension) importable here.

toploc is not in uv.lock: its PyPI wheels were built against an older torch and fail to import
beside torch 2.13 (an undefined symbol), and a source build must link the torch of this very
environment (no build isolation). So, in order:

1. already importable: nothing to do;
2. a prebuilt wheel for this Python in the wheels directory (`--wheels`, default `../shared/wheels`
   beside the checkout: this machine kind's, built for its torch): installed, then imported in a
   fresh interpreter; one that does not import is uninstalled and the next step runs;
3. built from the PyPI sdist against this environment's torch (`--no-build-isolation`, with
   setuptools and ninja; about 1.5 minutes on 2 cores).

`uv sync` (exact) removes what the lock does not name, so run this after it; `uv run` keeps it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

VERSION = "0.1.6"
DEFAULT_WHEELS = Path(__file__).resolve().parents[3] / "shared" / "wheels"  # ../shared/wheels beside the checkout


def importable() -> bool:
    """toploc imports, with its C++ extension, in a fresh interpreter of this environment."""
    return subprocess.run([sys.executable, "-c", "import toploc.C.csrc.poly"], capture_output=True).returncode == 0


def _pip(*args: str) -> None:
    uv = shutil.which("uv")
    cmd = [uv, "pip", *args[:1], "--python", sys.executable, *args[1:]] if uv else [sys.executable, "-m", "pip", *args]
    subprocess.run(cmd, check=True, env={**os.environ, "MAX_JOBS": str(os.cpu_count() or 1)})


def wheels_for_this_python(wheels: Path) -> list[Path]:
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return sorted(wheels.glob(f"toploc-{VERSION}-{tag}-{tag}-*.whl")) if wheels.is_dir() else []


def install(wheels: Path = DEFAULT_WHEELS) -> str:
    """What it did, in one line; CalledProcessError / RuntimeError if it could not."""
    if importable():
        return f"toploc already importable in {sys.prefix}"
    for wheel in wheels_for_this_python(wheels):
        _pip("install", "--no-deps", "--reinstall", str(wheel))
        if importable():
            return f"toploc installed from {wheel}"
        _pip("uninstall", "toploc")  # built for another torch: build instead
    _pip("install", "setuptools", "wheel", "ninja")
    _pip("install", "--no-deps", "--no-build-isolation", "--no-binary", "toploc", f"toploc=={VERSION}")
    if not importable():
        raise RuntimeError("toploc was built but does not import; see the build output above")
    return f"toploc {VERSION} built from source against torch in {sys.prefix}"

"""`composer-prime toploc install`: make TOPLOC (toploc 0.1.6, a C++ torch extension) importable here.

toploc is not in uv.lock: its PyPI wheels were built against an older torch and fail to import
beside torch 2.13 (an undefined symbol), and a source build must link the torch of this very
environment (no build isolation). So, in order:

1. already importable: nothing to do;
2. a prebuilt wheel for this Python in the wheels directory (`--wheels`, default `../shared/wheels`
   beside the checkout: this machine kind's, built for its torch): installed, then imported in a
   fresh interpreter; one that does not import is uninstalled and the next step runs;
3. built from the PyPI sdist against this environment's torch (`--no-build-isolation`, with
   setuptools and ninja; 1.5 minutes on a quiet 2-core machine, 6 on a loaded one: a line every 30 s
   says it is still building).

`uv sync` (exact) removes what the lock does not name, so run this after it; `uv run` keeps it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VERSION = "0.1.6"
DEFAULT_WHEELS = Path(__file__).resolve().parents[3] / "shared" / "wheels"  # ../shared/wheels beside the checkout


def importable() -> bool:
    """toploc imports, with its C++ extension, in a fresh interpreter of this environment."""
    return subprocess.run([sys.executable, "-c", "import toploc.C.csrc.poly"], capture_output=True).returncode == 0


def _pip(*args: str, still: str = "") -> None:
    """`uv pip` (or pip) with these arguments; with `still`, a line every 30 s while it runs (a build's minutes)."""
    uv = shutil.which("uv")
    cmd = [uv, "pip", *args[:1], "--python", sys.executable, *args[1:]] if uv else [sys.executable, "-m", "pip", *args]
    proc = subprocess.Popen(cmd, env={**os.environ, "MAX_JOBS": str(os.cpu_count() or 1)})
    start = time.monotonic()
    while True:
        try:
            proc.wait(timeout=30)
            break
        except subprocess.TimeoutExpired:
            if still:
                print(f"{still}: still running after {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)


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
    print(f"building toploc {VERSION} from source against this torch (1.5 to 6 minutes on 2 cores)", file=sys.stderr, flush=True)
    _pip("install", "--no-deps", "--no-build-isolation", "--no-binary", "toploc", f"toploc=={VERSION}",
         still="building toploc")
    if not importable():
        raise RuntimeError("toploc was built but does not import; see the build output above")
    return f"toploc {VERSION} built from source against torch in {sys.prefix}"

"""`composer-prime toploc install`: make TOPLOC (toploc 0.1.6, a C++ torch extension) importable here.

toploc is not in uv.lock: its PyPI wheels were built against an older torch and fail to import
beside torch 2.13 (an undefined symbol), and a source build must link the torch of this very
environment (no build isolation). So, in order:

1. already importable: nothing to do;
2. a prebuilt wheel for this Python in the wheels directory (`--wheels`, default `../shared/wheels`
   beside the checkout: this machine kind's, built for its torch): installed, then imported in a
   fresh interpreter; one that does not import is uninstalled and the next step runs;
3. built from its sdist against this environment's torch (`--no-build-isolation`, with setuptools
   and wheel; 1.5 minutes on a quiet 2-core machine, 6 on a loaded one: a line every 30 s says it is
   still building): the sdist in the wheels directory where there is one (`composer-prime wheelhouse`
   puts it there, so a node without a package index builds it with `--no-index`; its sha256 checked
   against `SDIST_SHA256`), else PyPI's.

`--target DIR` installs into DIR instead (an image whose environment is not yours to change; DIR then
goes on PYTHONPATH), as docs/install.md's read-only route does with the wheelhouse.
`uv sync` (exact) removes what the lock does not name, so run this after it; `uv run` keeps it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VERSION = "0.1.6"
SDIST = f"toploc-{VERSION}.tar.gz"
SDIST_URL = f"https://files.pythonhosted.org/packages/2d/26/33f275fef46469e55c19e0c58f10d2a062b97481e9fa21869b943524ee2e/{SDIST}"
SDIST_SHA256 = "7a566c2db29d94865baa2c53b5563b426fd118b56a163b515551419b65ea7072"  # PyPI's, 18,777 bytes
DEFAULT_WHEELS = Path(__file__).resolve().parents[3] / "shared" / "wheels"  # ../shared/wheels beside the checkout


def importable(target: Path | None = None) -> bool:
    """toploc imports, with its C++ extension, in a fresh interpreter of this environment (`target` first on its path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])} if target else None
    return subprocess.run([sys.executable, "-c", "import toploc.C.csrc.poly"], capture_output=True, env=env).returncode == 0


def pip_command(*args: str) -> list[str]:
    """`uv pip` with these arguments (uv's spelling), or pip's where there is no uv (a GPU node: `--reinstall` is
    pip's `--force-reinstall`)."""
    uv = shutil.which("uv")
    if uv:
        return [uv, "pip", *args[:1], "--python", sys.executable, *args[1:]]
    return [sys.executable, "-m", "pip", *("--force-reinstall" if a == "--reinstall" else a for a in args)]


def _pip(*args: str, still: str = "") -> None:
    """`uv pip` (or pip) with these arguments; with `still`, a line every 30 s while it runs (a build's minutes)."""
    cmd = pip_command(*args)
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


def _uninstall(target: Path | None) -> None:
    """Remove toploc (pip's uninstall asks before it acts, so `-y` there; uv's never asks)."""
    if target:
        for path in [target / "toploc", *target.glob(f"toploc-{VERSION}.dist-info")]:
            shutil.rmtree(path, ignore_errors=True)
    elif shutil.which("uv"):
        _pip("uninstall", "toploc")
    else:
        _pip("uninstall", "-y", "toploc")


def wheels_for_this_python(wheels: Path) -> list[Path]:
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return sorted(wheels.glob(f"toploc-{VERSION}-{tag}-{tag}-*.whl")) if wheels.is_dir() else []


def local_sdist(wheels: Path) -> Path | None:
    """The sdist in the wheels directory, if there is one; RuntimeError if it is not PyPI's file."""
    sdist = wheels / SDIST
    if not sdist.is_file():
        return None
    if hashlib.sha256(sdist.read_bytes()).hexdigest() != SDIST_SHA256:
        raise RuntimeError(f"{sdist}: its sha256 is not PyPI's for toploc {VERSION} ({SDIST_SHA256[:12]}...)")
    return sdist


def install(wheels: Path = DEFAULT_WHEELS, target: Path | None = None) -> str:
    """What it did, in one line; CalledProcessError / RuntimeError if it could not."""
    into = ["--target", str(target)] if target else []
    where = f"{target}" if target else sys.prefix
    if importable(target):
        return f"toploc already importable in {where}"
    for wheel in wheels_for_this_python(wheels):
        _pip("install", "--no-deps", "--reinstall", *into, str(wheel))
        if importable(target):
            return f"toploc installed from {wheel}"
        _uninstall(target)  # built for another torch: build instead
    sdist = local_sdist(wheels)
    offline = ["--no-index", "--find-links", str(wheels)] if sdist else []  # the wheelhouse's: no index needed
    # the build's own tools (no build isolation: it must see this torch); wheel and ninja help, setuptools is needed
    tools = [m for m in ("setuptools", "wheel", "ninja") if importlib.util.find_spec(m) is None]
    if offline and "setuptools" in tools:
        raise RuntimeError("building toploc with no package index needs setuptools in this environment (torch brings "
                           "it on Python 3.12 and later)")
    if tools and not offline:
        _pip("install", *tools)
    print(f"building toploc {VERSION} from {sdist or 'its PyPI sdist'} against this torch (1.5 to 6 minutes on 2 cores)",
          file=sys.stderr, flush=True)
    _pip("install", "--no-deps", "--no-build-isolation", *offline, *into,
         *([str(sdist)] if sdist else ["--no-binary", "toploc", f"toploc=={VERSION}"]), still="building toploc")
    if not importable(target):
        raise RuntimeError("toploc was built but does not import; see the build output above")
    return f"toploc {VERSION} built from {sdist.name if sdist else 'source'} against torch in {where}"

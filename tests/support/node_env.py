"""A GPU node without a package index, stood in for here: a fresh CPython 3.12 environment with torch of its own,
into which docs/install.md's node lines install the wheelhouse (`composer-prime wheelhouse`) exactly as written.

What stands in for the node's image: `python3.12 -m venv` (pip inside, as a CUDA image's Python has it) and
PyPI's torch for 3.12 at the lock's version (its CUDA build, which runs on a CPU: the CPU index is not
reachable from this machine kind), its bytecode compiled as an image's pip leaves it (`node_torch`: installed
by uv into the cache once a machine, hardlinked into each node's site-packages; uncompiled, the documented
`toploc install` compiled all of torch again every session). Then, with no uv on PATH (a node has
none) and the wheelhouse beside it, docs/install.md's own lines, read from the page: `python3 -m pip install
--no-index --find-links wheelhouse 'composer-prime[gguf]'`, `python3 -m pip check`, `composer-prime toploc
install --wheels wheelhouse`.

TOPLOC: the node builds it from the wheelhouse's sdist against its own torch (about 4 minutes on 2 quiet
cores, 8 under load). Built once here with pip from that same sdist, against this stand-in's torch, and kept
in the cache by Python, torch version and sdist hash; the node's wheelhouse then holds that wheel beside the
sdist, and the documented command takes it (its prebuilt-wheel route, import-checked, as every install on
this machine kind takes `../shared/wheels`'), so only the first run on a machine pays for the build.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from composer_prime.model.tiny import cache_root
from composer_prime.utils.fs import built_once
from composer_prime.verify.install import SDIST, SDIST_SHA256, VERSION
from tests.conftest import ROOT

INSTALL = (ROOT / "docs" / "install.md").read_text()
COMMAND = re.search(r"^uv run composer-prime wheelhouse .*$", INSTALL, re.M).group(0)  # the connected machine's
NODE_LINES = INSTALL.split("Copy the directory", 1)[1].split("```text\n", 1)[1].split("```", 1)[0].splitlines()
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # no uv, no pyenv: a node's


@dataclass
class Node:
    python: Path  # the node environment's python3
    root: Path  # holds `wheelhouse/` (the node's copy), the working directory of the documented lines
    said: dict[str, list[str]] = field(default_factory=dict)  # each documented line's output, its lines
    seconds: dict[str, float] = field(default_factory=dict)  # each stage's wall time (reported, never asserted)

    @property
    def env(self) -> dict[str, str]:
        """The node's environment: its bin first on a system PATH without uv; the project's venv not active."""
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "UV_PROJECT_ENVIRONMENT")}
        return env | {"PATH": f"{self.python.parent}:{SYSTEM_PATH}"}


def python312() -> str:
    """A CPython 3.12 interpreter on this machine (pyenv's 3.12.1 on this machine kind)."""
    for candidate in [shutil.which("python3.12"), *sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.12*/bin/python3.12")))]:
        if candidate and subprocess.run([candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                                        capture_output=True).returncode == 0:
            return candidate
    pytest.fail("no CPython 3.12 here (the node's Python): install one (pyenv install 3.12)")


def lock_torch() -> str:
    """The torch version the lock takes from PyPI (the one a 3.12 environment of this project gets)."""
    packages = tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    [version] = {p["version"] for p in packages if p["name"] == "torch" and "pypi.org" in p["source"].get("registry", "")}
    return version


def sh(cmd: list[str], what: str, **kw) -> str:
    """Run `cmd`; its output (stdout and stderr), or a failure naming the stage and the output's tail."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, **kw)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{what}: {shlex.join(map(str, cmd))} exited {r.returncode}\n{out[-4000:]}"
    return out


def build_wheelhouse(tmp: Path) -> Path:
    """docs/install.md's `composer-prime wheelhouse` command (download only), its --out pointed at `tmp`/wheelhouse."""
    out = tmp / "wheelhouse"
    argv = shlex.split(COMMAND)
    argv[argv.index("--out") + 1] = str(out)
    uv = shutil.which("uv") or pytest.fail("uv is not on PATH")
    # --no-sync: the environment the suite runs in (a bare `uv run` would re-sync it)
    r = subprocess.run([uv, "run", "--no-sync", "--project", str(ROOT), *argv[2:]], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == str(out)
    return out


def toploc_wheel(python: Path, torch: str, sdist: Path) -> Path:
    """TOPLOC's wheel for this Python and torch, built once from the wheelhouse's sdist with pip (no index, no
    build isolation: against this torch) and kept in the cache; about 4 minutes on 2 cores the first time."""
    tag = "cp" + sh([str(python), "-c", "import sys; print(*sys.version_info[:2], sep='')"], "python").strip()

    def build(tmp: Path) -> None:
        sh([str(python), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp), str(sdist)],
           "building TOPLOC's wheel", env={**os.environ, "MAX_JOBS": str(os.cpu_count() or 1)})
        (tmp / "READY").write_text(SDIST_SHA256)

    out = built_once(cache_root() / "node-toploc" / f"toploc-{VERSION}-{tag}-torch{torch}-{SDIST_SHA256[:12]}", build)
    [wheel] = out.glob(f"toploc-{VERSION}-{tag}-{tag}-*.whl")
    return wheel


def link_or_copy(src: str, dst: str) -> None:
    """A hard link to `src` at `dst`, or a copy where they are on different file systems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def node_torch(python: str, torch: str) -> Path:
    """A site-packages tree holding PyPI's torch `torch` (and what it needs) for `python`, its bytecode compiled, as an
    image's pip leaves it; built once a machine in the cache (uv, from its own cache) and hardlinked into each node."""
    tag = "cp" + sh([python, "-c", "import sys; print(*sys.version_info[:2], sep='')"], "python").strip()
    uv = shutil.which("uv") or pytest.fail("uv is not on PATH")

    def build(tmp: Path) -> None:
        sh([uv, "pip", "install", "-q", "--python", python, "--target", str(tmp / "site"), "--compile-bytecode",
            f"torch=={torch}"], "the node's own torch")
        shutil.rmtree(tmp / "site" / "bin", ignore_errors=True)  # console scripts naming this build's path
        (tmp / "READY").write_text(torch)

    return built_once(cache_root() / "node-torch" / f"torch{torch}-{tag}", build) / "site"


def install_node(wheelhouse: Path, root: Path) -> Node:
    """The stand-in node at `root`, the wheelhouse installed into it by docs/install.md's lines."""
    node = Node(root / "node" / "bin" / "python3", root)
    start = time.monotonic()
    python, torch = python312(), lock_torch()
    sh([python, "-m", "venv", str(root / "node")], "the node's Python")
    [site] = (root / "node" / "lib").glob("python3.12/site-packages")
    # the image's torch, compiled: links to the cache's files (nothing here writes them: pip leaves torch alone, and a
    # compile writes a new file in place of a stale .pyc, never into it)
    shutil.copytree(node_torch(python, torch), site, copy_function=link_or_copy, dirs_exist_ok=True)
    node.seconds["venv and torch"] = time.monotonic() - start
    start = time.monotonic()
    copy = root / "wheelhouse"  # the node's copy: the wheelhouse's files, and TOPLOC's wheel for this torch
    copy.mkdir()
    for f in wheelhouse.iterdir():
        (copy / f.name).symlink_to(f)
    wheel = toploc_wheel(node.python, torch, copy / SDIST)
    (copy / wheel.name).symlink_to(wheel)
    node.seconds["toploc wheel"] = time.monotonic() - start
    for line in NODE_LINES[:3]:  # the install, pip check, toploc install; the last line is the quickstart
        argv = shlex.split(line)
        start = time.monotonic()
        out = sh([str(node.python) if argv[0] == "python3" else argv[0], *argv[1:]], line, cwd=root, env=node.env)
        node.seconds[line], node.said[line] = time.monotonic() - start, out.strip().splitlines()
    (root / "seconds.json").write_text(json.dumps(node.seconds, indent=1))  # kept with the run, for a reader
    return node

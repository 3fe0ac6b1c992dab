"""Get a source tree ready (unpack, strip), find its layout, and record its test baseline."""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from feature_deletion.pytest_run import Outcome
from feature_deletion.requirements import Declared, declared

# Anything that could hold a pristine copy of the code or hints about it: VCS history, bytecode,
# type-checker and test caches, build outputs (build/lib is a full copy), packaging metadata.
STRIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytype", ".pyre", ".ruff_cache",
              ".pytest_cache", ".hypothesis", ".tox", ".nox", ".venv", "venv", ".eggs", "build", "dist"}
STRIP_FILES = ["*.pyc", "*.pyo", "*.orig", "*.rej", ".coverage", ".coverage.*"]
CONFIG_FILES = ("pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "conftest.py")
TEST_DIRS = {"tests", "test"}
# Top-level names that are build or project tooling, not the library.
NOT_SOURCE = {"setup", "conftest", "noxfile", "fabfile", "tasks", "docs", "doc", "examples", "benchmarks",
              "versioneer", "ez_setup", "distribute_setup", "runtests", "run_tests", "manage"}


TARS = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")  # what `unpack` unpacks, with .zip


class BuildError(Exception):
    """Bad input: reported to the user as one line, never as a traceback."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _ignore(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n in STRIP_DIRS or n.endswith(".egg-info")
            or any(fnmatch.fnmatch(n, p) for p in STRIP_FILES)}


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=_ignore, symlinks=True)


def sdist_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "composer-prime" / "sdists"


def fetch_pypi(spec: str, log=lambda m: None) -> Path:
    """`name==version` -> its sdist, downloaded once with pip into the cache."""
    name, sep, version = spec.partition("==")
    if not sep or not re.fullmatch(r"[A-Za-z0-9._-]+", name) or not re.fullmatch(r"[A-Za-z0-9.+!_-]+", version):
        raise BuildError(f"pypi source must pin one version, e.g. pypi:inflection==0.5.1 (got pypi:{spec})")
    dest = sdist_cache() / f"{name.lower()}=={version}"
    found = sorted(p for p in dest.glob("*") if p.name.endswith((".tar.gz", ".zip"))) if dest.is_dir() else []
    if found:
        return found[0]
    # The venv may have no pip of its own (uv venvs do not): then any pip on PATH downloads as well.
    found_pip = shutil.which("pip3") or shutil.which("pip") or ""
    pip = [sys.executable, "-m", "pip"] if importlib.util.find_spec("pip") else [found_pip]
    if not pip[0]:
        raise BuildError("pip is needed to download pypi sources and none was found")
    log(f"downloading {name}=={version} (sdist) into {dest}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as tmp:
        out = subprocess.run([*pip, "download", "--no-binary", ":all:", "--no-deps",
                              "-q", "-d", tmp, f"{name}=={version}"], capture_output=True, text=True)
        files = [p for p in Path(tmp).iterdir() if p.name.endswith((".tar.gz", ".zip"))]
        if out.returncode != 0 or len(files) != 1:
            last = (out.stderr.strip().splitlines() or ["no sdist downloaded"])[-1]
            raise BuildError(f"pip download {name}=={version} failed: {last}")
        shutil.rmtree(dest, ignore_errors=True)
        Path(tmp).rename(dest)  # atomic: the cache never holds a half-downloaded file
    return dest / files[0].name


def check_source(source: str) -> None:
    """Raise BuildError for a source a build cannot start from, before the build writes anything
    (its log included): a pypi spec that is malformed or that the index has no sdist for (fetched
    here, quietly, into the cache the build then reads), a missing path, a file that is no sdist."""
    if source.startswith("pypi:"):
        fetch_pypi(source[5:])
        return
    path = Path(source).expanduser()
    if not path.exists():
        raise BuildError(f"source not found: {source}")
    if path.is_file() and not path.name.endswith((*TARS, ".zip")):
        raise BuildError(f"not an sdist (.tar.gz or .zip) or a directory: {source}")


def unpack(source: Path, dest: Path) -> tuple[str, str | None, Declared]:
    """Copy a directory or unpack an sdist into `dest` (stripped). Returns (kind, sha256, what it
    declares it needs: read before stripping, which removes `*.egg-info`)."""
    if source.is_dir():
        copy_tree(source, dest)
        return "dir", None, declared(source)
    if not source.is_file():
        raise BuildError(f"source not found: {source}")
    with tempfile.TemporaryDirectory(prefix="fd-unpack-") as tmp:
        if source.name.endswith(TARS):
            with tarfile.open(source) as tar:
                tar.extractall(tmp, filter="data")  # "data" refuses absolute paths and links out
        elif source.suffix == ".zip":
            with zipfile.ZipFile(source) as z:
                z.extractall(tmp)
        else:
            raise BuildError(f"not an sdist (.tar.gz or .zip) or a directory: {source}")
        entries = list(Path(tmp).iterdir())
        root = entries[0] if len(entries) == 1 and entries[0].is_dir() else Path(tmp)
        copy_tree(root, dest)
        needs = declared(root)
    return "sdist", sha256(source), needs


@dataclass
class Layout:
    modules: list[str]            # importable top-level names the project provides
    source_files: list[str]       # relative .py paths whose functions may be deleted
    test_paths: list[str]         # test dirs/files, conftest.py files and runner config
    pytest_opts: list[str]        # options every run needs (`-o pythonpath=src` for a src layout)
    test_targets: list[str]       # test dirs and files a full-suite run collects
    include: list[Path] = field(default_factory=list)  # what coverage measures


def is_test_file(name: str) -> bool:
    return name == "conftest.py" or (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")))


def find_layout(tree: Path) -> Layout:
    src_root = tree / "src" if (tree / "src").is_dir() and not (tree / "src" / "__init__.py").exists() else tree
    modules, include = [], []
    for p in sorted(src_root.iterdir()):
        ident = p.stem if p.suffix == ".py" else p.name
        if not ident.isidentifier() or ident in NOT_SOURCE or ident in TEST_DIRS or is_test_file(p.name):
            continue
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.is_file() and p.suffix == ".py"):
            modules.append(ident)
            include.append(p)
    tests, test_files = set(), []
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        rel = Path(dirpath).relative_to(tree)
        in_test_dir = next((i for i, part in enumerate(rel.parts) if part in TEST_DIRS), None)
        if in_test_dir is not None:
            if any(f.endswith(".py") for f in filenames):
                tests.add(Path(*rel.parts[:in_test_dir + 1]).as_posix())
            continue
        for f in sorted(filenames):
            if is_test_file(f):
                tests.add((rel / f).as_posix())
                if f != "conftest.py":
                    test_files.append((rel / f).as_posix())
    runnable = sorted(t for t in tests if not t.endswith("conftest.py"))
    config = [c for c in CONFIG_FILES if (tree / c).is_file()]
    test_paths = sorted(tests | set(config))
    sources = []
    for inc in include:
        files = [inc] if inc.is_file() else sorted(inc.rglob("*.py"))
        for f in files:
            rel = f.relative_to(tree).as_posix()
            if not is_test_file(f.name) and not any(rel == t or rel.startswith(t + "/") for t in tests):
                sources.append(rel)
    opts = ["-o", "pythonpath=src"] if src_root != tree else []
    return Layout(modules, sources, test_paths, opts, runnable, include)


@dataclass
class Baseline:
    collected: list[str]
    stable_passing: list[str]
    unstable: list[str]
    failing: list[str]
    skipped: list[str]


def classify(runs: list[dict[str, Outcome]]) -> Baseline:
    """stable passing: passed in every run; unstable: passed in some; failing: failed or
    errored in every run; skipped: everything else (skips, xfails)."""
    ids = sorted(set().union(*runs))
    stable, unstable, failing, skipped = [], [], [], []
    for t in ids:
        outs = [r.get(t, "missing") for r in runs]
        if all(o == "passed" for o in outs):
            stable.append(t)
        elif "passed" in outs:
            unstable.append(t)
        elif "failed" in outs or "error" in outs:
            failing.append(t)
        else:
            skipped.append(t)
    return Baseline(ids, stable, unstable, failing, skipped)

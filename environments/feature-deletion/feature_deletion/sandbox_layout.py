"""What the sandbox can see: system directories, the interpreter, an allow-listed site-packages.

The interpreter is the venv's python resolved to its base binary and run with -S, so nothing of
any site-packages is on sys.path but /sandbox/site: a task's own test environment (testenv.py)
or, for a task set built without one, the allow-listed distributions (pytest, coverage and their
dependencies), bind-mounted one by one. The rest of the venv, the base
interpreter's own site-packages, the system's dist-packages and bundled wheels may hold the task's
library and are never shown.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import sys
import sysconfig
from glob import glob
from pathlib import Path

SANDBOX_SITE = "/sandbox/site"
DEFAULT_PACKAGES = ("pytest", "coverage")
# Where the pristine code of a third-party library could hide below a visible prefix.
MASK_GLOBS = (
    "lib/python3*/site-packages", "lib/python3*/dist-packages", "lib/python3/dist-packages",
    "local/lib/python3*/site-packages", "local/lib/python3*/dist-packages", "share/python-wheels",
    "lib/python3*/ensurepip/_bundled", "src", "local/src",
)
ETC_FILES = ("ld.so.cache", "localtime")
ETC_GENERATED = [["/etc/passwd", "root:x:0:0:sandbox:/tmp:/bin/sh\n"], ["/etc/group", "root:x:0:\n"]]


@functools.cache
def interpreter() -> tuple[str, str]:
    """(the real interpreter binary, its prefix): the venv's python resolved to its base."""
    return os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)


def python_argv(*args: str, safe_path: bool = True) -> list[str]:
    """A python command for inside the sandbox: no site (no .pth, no sitecustomize, no
    site-packages but the allow-listed ones on PYTHONPATH), no bytecode written. `safe_path`
    keeps the cwd off sys.path; a test suite run as `python -m pytest` from the repo root needs it
    there (what the task's baseline was recorded with), so scoring never lets agent files into the
    repo root, where they could shadow `pytest` or the stdlib."""
    return [interpreter()[0], "-S", "-B", *(["-P"] if safe_path else []), *args]


@functools.cache
def site_entries(packages: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(host path, name) of each top-level site-packages entry of `packages` and their
    dependencies. Only these are visible: the rest of the venv might hold the task's library."""
    if not packages:
        return ()
    from packaging.requirements import Requirement

    todo, seen, out = list(packages), set(), {}
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        dist = importlib.metadata.distribution(name)
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        base = Path(str(dist.locate_file("")))
        for f in dist.files or []:
            top = f.parts[0]
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and (base / top).exists():
                out[top] = str(base / top)
    return tuple(sorted((path, name) for name, path in out.items()))


def system_layout() -> tuple[list[dict], list[str], list[list[str]]]:
    binds, masks, links = [], [], []
    for name in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            links.append([f"/{name}", os.readlink(host)])
        elif host.is_dir():
            binds.append({"src": str(host), "dst": f"/{name}", "rw": False, "dir": True})
    for name in ETC_FILES:
        if Path("/etc", name).is_file():
            binds.append({"src": f"/etc/{name}", "dst": f"/etc/{name}", "rw": False, "dir": False})
    exe, prefix = interpreter()
    roots = ["/usr"]
    if not prefix.startswith("/usr/"):
        binds.append({"src": prefix, "dst": prefix, "rw": False, "dir": True})
        roots.append(prefix)
    if not exe.startswith(("/usr/", prefix + "/")):
        binds.append({"src": exe, "dst": exe, "rw": False, "dir": False})
    for root in roots:
        for pattern in MASK_GLOBS:
            masks += [p for p in glob(f"{root}/{pattern}") if os.path.isdir(p) and not os.path.islink(p)]
    for dev in ("null", "zero", "full", "random", "urandom"):
        binds.append({"src": f"/dev/{dev}", "dst": f"/dev/{dev}", "rw": True, "dir": False})
    return binds, sorted(set(masks)), links


@functools.cache
def _index(roots: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """name -> paths of every file and directory under `roots` (never inside the masked trees or
    the interpreter's own standard library). Built once per process: a few seconds for the
    130,000 files of a system's /usr."""
    skip = {*system_layout()[1], os.path.realpath(sysconfig.get_paths()["stdlib"])}
    index: dict[str, list[str]] = {}
    for root in roots:
        for top, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip]
            for name in dirs + files:
                index.setdefault(name, []).append(os.path.join(top, name))
    return {k: tuple(v) for k, v in index.items()}


# pytest and coverage run every suite and break with a file of theirs hidden; a module of theirs
# named like the task's library is their own code, not a copy of it (pytest's _pytest/_io/wcwidth.py).
MACHINERY = frozenset({"_pytest", "coverage"})


@functools.cache
def copies_of(modules: tuple[str, ...], tree: str | None = None, seen_as: str = "") -> tuple[list[dict], list[str]]:
    """(binds of /dev/null over modules `<m>.py`, masks over packages `<m>/`) for every copy of
    these top-level modules in the visible system trees, or in `tree` (a test environment, seen at
    `seen_as` inside): a tool under /usr, or a test dependency, may vendor the very library a task
    deleted a function from (the Google Cloud SDK ships six; urllib3 1.x carries it too)."""
    if not modules:
        return [], []
    binds, masks, links = system_layout()
    roots = tuple(b["src"] for b in binds if b["dir"] and not b["src"].startswith("/dev")) if tree is None else (tree,)
    index, inside = _index(roots), (lambda p: p if tree is None else seen_as + p[len(tree):])
    out_binds, out_masks = [], []
    for m in modules:
        files = [p for p in index.get(f"{m}.py", ()) if not MACHINERY.intersection(p.split("/"))]
        dirs = [p for p in index.get(m, ()) if not MACHINERY.intersection(p.split("/"))]
        out_binds += [{"src": "/dev/null", "dst": inside(p), "rw": False, "dir": False}
                      for p in files if os.path.isfile(p)]
        out_masks += [inside(p) for p in dirs if os.path.isdir(p) and not os.path.islink(p)
                      and any(f.endswith(".py") for f in os.listdir(p))]
    # a copy inside another (vendor/six/src/six) is hidden with it, and could not be mounted on once it is
    out_masks = [p for p in sorted(set(out_masks)) if not any(p.startswith(q + "/") for q in out_masks)]
    return out_binds, out_masks


def python_mounts(packages: tuple[str, ...], hidden: tuple[str, ...],
                  site: Path | None) -> tuple[list[dict], list[dict], list[str]]:
    """(binds for /sandbox/site, binds hiding copies of the task's library, masks hiding them).
    /sandbox/site is the task's test environment or, without one, the allow-listed `packages` of
    this venv; ValueError when either provides one of the `hidden` modules at its top level."""
    hidden = tuple(sorted(hidden))
    hiding, masks = copies_of(hidden)
    if site is None:
        binds = []
        for path, name in site_entries(packages):
            if name.removesuffix(".py") in hidden:
                raise ValueError(f"package {name} ({path}) is the task's own library: refusing to expose it")
            binds.append({"src": path, "dst": f"{SANDBOX_SITE}/{name}", "rw": False, "dir": os.path.isdir(path)})
        return binds, hiding, masks
    site = Path(site).resolve()
    if not site.is_dir():
        raise ValueError(f"test environment not found: {site}")
    for name in hidden:
        if (site / name).exists() or (site / f"{name}.py").exists():
            raise ValueError(f"the test environment {site} holds {name}, the task's own library: refusing to expose it")
    nested, nested_masks = copies_of(hidden, str(site), SANDBOX_SITE)  # vendored inside a dependency
    return [{"src": str(site), "dst": SANDBOX_SITE, "rw": False, "dir": True}], hiding + nested, masks + nested_masks

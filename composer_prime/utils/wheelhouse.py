"""`composer-prime wheelhouse`: every wheel a machine without a package index needs, in one directory.

Cluster GPU nodes often have no internet, and their images ship their own Python (3.12 in CUDA
images) and their own torch. On a connected machine this writes, for the node's Python and
platform, the lock's exact files (uv.lock's pins and sha256 hashes, through `uv export`), leaving
out what the node already has, plus wheels of this project and of its environments
(`uv build --wheel`), and TOPLOC's sdist, which the node builds against its own torch. Copied to the
node, it installs with `pip install --no-index` (docs/install.md, "A GPU node without a package index").

Leaving a package out (`--exclude torch`) is uv's `--prune`: the package and whatever only it needs
(torch's nvidia-* and triton), so an exclude list names what the node has, not its dependencies.
`--node-has FILE` (the node's `pip freeze`) leaves out every needed package the node already has: an
image that carries most of them (a CUDA image with transformers, numpy, pandas ...) then needs a
wheelhouse of tens of MB, not hundreds; its versions must be in the project's ranges (`pip check`).
A file already in the directory with the right hash is kept, so an interrupted run resumes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import Marker
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]  # the checkout: pyproject.toml and uv.lock
# manylinux2014 and older names the same glibc as a manylinux_2_N tag; wheels still carry them
LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


class WheelhouseError(Exception):
    """Bad input or a failed step, said in one line."""


@dataclass(frozen=True)
class Node:
    """The machine the wheelhouse is for: its Python (3.N) and its platform tag (manylinux_2_G_ARCH)."""

    python: str
    platform: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"3\.\d+", self.python):
            raise WheelhouseError(f"--python {self.python}: give the node's Python as 3.N (e.g. 3.12)")
        admitted = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
        if f"{self.python}.0" not in admitted:
            raise WheelhouseError(f"--python {self.python}: the project's requires-python ({admitted}) does not admit it")
        if not re.fullmatch(r"manylinux_2_\d+_(x86_64|aarch64)", self.platform):
            raise WheelhouseError(f"--platform {self.platform}: give the node's manylinux tag, e.g. manylinux_2_28_x86_64 "
                                  "(its glibc, from `ldd --version`, and its machine)")

    @property
    def minor(self) -> int:
        return int(self.python.split(".")[1])

    def tags(self) -> list[Tag]:
        """The wheel tags this node installs, most specific first (as pip ranks them)."""
        glibc, arch = int(self.platform.split("_")[2]), self.platform.split("_", 3)[3]
        platforms = []
        for g in range(glibc, 4, -1):
            platforms.append(f"manylinux_2_{g}_{arch}")
            if g in LEGACY and (g == 17 or arch == "x86_64"):
                platforms.append(f"{LEGACY[g]}_{arch}")
        version, interpreter = (3, self.minor), f"cp3{self.minor}"
        return [*cpython_tags(version, abis=[interpreter], platforms=platforms),
                *compatible_tags(version, interpreter=interpreter, platforms=platforms)]

    def environment(self) -> dict[str, str]:
        """The environment markers this node evaluates (the lock's per-platform and per-Python entries)."""
        full = f"{self.python}.0"
        return {"python_version": self.python, "python_full_version": full, "implementation_version": full,
                "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                "platform_machine": self.platform.split("_", 3)[3], "implementation_name": "cpython",
                "platform_python_implementation": "CPython", "platform_release": "", "platform_version": ""}


@dataclass
class Plan:
    """What goes in: files to fetch (name, url or local path, sha256 or None, size), directories to build,
    what was left out."""

    downloads: list[tuple[str, str, str, int]] = field(default_factory=list)
    builds: list[Path] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)


def _uv() -> str:
    uv = os.environ.get("UV") or shutil.which("uv")
    if not uv:
        raise WheelhouseError("uv is not on PATH (pip install uv)")
    return uv


def _export(extras: list[str], prune: list[str]) -> list[dict]:
    """The lock's packages for these extras (no dev group, not the project itself), as pylock.toml entries."""
    if not (ROOT / "uv.lock").is_file():
        raise WheelhouseError(f"no uv.lock in {ROOT}: run this from a checkout of composer-prime")
    cmd = [_uv(), "export", "--locked", "--no-dev", "--no-emit-project", "--format", "pylock.toml", "-q",
           *(a for e in extras for a in ("--extra", e)), *(a for p in prune for a in ("--prune", p))]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode:
        lines = r.stderr.strip().splitlines()
        raise WheelhouseError(f"uv export failed: {lines[-1].removeprefix('error: ') if lines else r.returncode}")
    return tomllib.loads(r.stdout)["packages"]


def node_has(freeze: str) -> set[str]:
    """The packages a node's `python3 -m pip freeze` (or `pip list --format=freeze`) names, canonicalized."""
    lines = (line.split("#")[0].strip() for line in freeze.splitlines())
    return {canonicalize_name(re.split(r"\s*(?:===|==|@|>=|~=)\s*", line)[0]) for line in lines
            if line and not line.startswith("-")}


def plan(node: Node, extras: list[str], exclude: list[str], has: set[str] = frozenset()) -> Plan:
    """What to download and build for `node`; `exclude` must be among the needed packages, `has` (the node's
    own packages, from `node_has`) need not: those among them that this install needs are left out too."""
    everything = _export(extras, [])
    names = {canonicalize_name(p["name"]) for p in everything}
    unknown = [e for e in exclude if canonicalize_name(e) not in names]
    if unknown:
        raise WheelhouseError(f"--exclude {','.join(unknown)}: not among the packages this install needs")
    exclude = sorted({*exclude, *(names & has)})
    kept = _export(extras, exclude) if exclude else everything
    out = Plan(left_out=sorted(names - {canonicalize_name(p["name"]) for p in kept}))
    rank = {tag: i for i, tag in enumerate(node.tags())}
    env, missing = node.environment(), []
    for p in kept:
        if p.get("marker") and not Marker(p["marker"]).evaluate(env):
            continue
        if "directory" in p:  # an environment of this repository (a path source)
            out.builds.append(ROOT / p["directory"]["path"])
            continue
        fits = [(min(rank[t] for t in tags if t in rank), w) for w in p.get("wheels", [])
                for tags in [parse_wheel_filename(_source(w).rsplit("/", 1)[-1])[3]] if tags & rank.keys()]
        if not fits:
            missing.append(f"{p['name']}=={p['version']}")
            continue
        wheel = min(fits, key=lambda f: f[0])[1]
        out.downloads.append((p["name"], _source(wheel), wheel.get("hashes", {}).get("sha256"), wheel.get("size", 0)))
    if missing:
        raise WheelhouseError(f"no wheel for cp3{node.minor} {node.platform} in the lock for {', '.join(missing)}; "
                              "if the node has them, add them to --exclude")
    return out


def _source(wheel: dict) -> str:
    """A wheel's url (file:// for a find-links directory's), or its path where the export gives one."""
    return wheel.get("url") or "file://" + wheel["path"]


def _download(url: str, sha256: str | None, dest: Path) -> None:
    import httpx

    if dest.is_file() and hashlib.sha256(dest.read_bytes()).hexdigest() == sha256:
        return  # from an earlier run
    part, digest = dest.with_name(dest.name + ".part"), hashlib.sha256()
    try:
        if url.startswith("file://"):  # a find-links directory's file (this machine kind's CPU torch)
            shutil.copyfile(url.removeprefix("file://"), part)
            digest.update(part.read_bytes())
        else:
            with httpx.stream("GET", url, follow_redirects=True, timeout=60) as r, open(part, "wb") as f:
                r.raise_for_status()
                for chunk in r.iter_bytes(1 << 20):
                    digest.update(chunk)
                    f.write(chunk)
    except httpx.HTTPError as e:
        part.unlink(missing_ok=True)
        raise WheelhouseError(f"downloading {dest.name} failed: {type(e).__name__}: {e}") from None
    if sha256 is not None and digest.hexdigest() != sha256:
        part.unlink()
        raise WheelhouseError(f"{dest.name}: its sha256 is not the lock's (a changed file on the index)")
    os.replace(part, dest)


def build(node: Node, out: Path, extras: list[str], exclude: list[str], has: set[str] = frozenset(),
          sdists: tuple[tuple[str, str], ...] = ()) -> Plan:
    """Fill `out` for `node`: the lock's wheels, less `exclude`, what the node `has` and what only they need, this
    project's, and `sdists` ((url, sha256) each: what the node builds against its own torch, such as TOPLOC)."""
    the_plan = plan(node, extras, exclude, has)
    out.mkdir(parents=True, exist_ok=True)
    log.info(f"downloading {len(the_plan.downloads)} wheels ({sum(d[3] for d in the_plan.downloads) / 1e6:.0f} MB) "
             f"for cp3{node.minor} {node.platform} into {out}")
    with ThreadPoolExecutor(8) as pool:  # many small files: the round trips, not the bandwidth, set the time
        list(pool.map(lambda d: _download(d[1], d[2], out / d[1].rsplit("/", 1)[-1]), the_plan.downloads))
    for url, sha256 in sdists:
        _download(url, sha256, out / url.rsplit("/", 1)[-1])
    wanted = {d[1].rsplit("/", 1)[-1] for d in the_plan.downloads}
    for src in [ROOT, *the_plan.builds]:  # pure-Python wheels (hatchling): one serves every Python and platform
        r = subprocess.run([_uv(), "build", "--wheel", "--out-dir", str(out), str(src)], capture_output=True, text=True)
        made = re.findall(r"Successfully built (\S+\.whl)", r.stderr)
        if r.returncode or not made:
            raise WheelhouseError(f"uv build --wheel {src} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        wanted |= {Path(m).name for m in made}
    for stale in out.glob("*.whl"):  # two versions of one package stop a `pip install *.whl`
        if stale.name not in wanted:
            log.info(f"removing {stale.name}: not in this wheelhouse's plan (an earlier run's)")
            stale.unlink()
    return the_plan

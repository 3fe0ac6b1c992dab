"""Build a hub artifact: the wheel (what `install` installs), the source archive (what `pull`
extracts) and the content hash, plus the metadata `prime env push` sends with each upload."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from dataclasses import asdict, dataclass, field
from email.parser import Parser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from composer_prime.hub.errors import ToolError
from composer_prime.hub.files import collect_files, content_hash

VERIFIERS_V1, VERIFIERS_V0 = "VERIFIERS_V1", "VERIFIERS_V0"
MANIFEST = "hub-manifest.json"


@dataclass
class Artifact:
    name: str
    version: str
    content_hash: str
    wheel: Path
    wheel_sha256: str
    source: Path
    source_sha256: str
    files: list[str]
    runtime_hint: str | None
    metadata: dict = field(default_factory=dict)

    @property
    def source_filename(self) -> str:
        """The name the hub stores the archive under (prime's convention)."""
        return f"{self.name}-{self.version}-{self.content_hash[:8]}.tar.gz"

    def manifest(self) -> dict:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


def read_project(root: Path) -> dict:
    path = root / "pyproject.toml"
    if not path.is_file():
        raise ToolError(f"{root} has no pyproject.toml (is it an environment directory?)")
    try:
        project = tomllib.loads(path.read_text()).get("project", {})
    except tomllib.TOMLDecodeError as e:
        raise ToolError(f"{path}: {e}") from None
    if not project.get("name") or not project.get("version"):
        raise ToolError(f"{path}: [project] needs a name and a version")
    return project


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_wheel(root: Path, out_dir: Path) -> Path:
    """Build the wheel as `prime env push` does (uv if present, else `python -m build`)."""
    with tempfile.TemporaryDirectory() as tmp:
        if shutil.which("uv"):
            cmd = ["uv", "build", "--wheel", "--out-dir", tmp]
        else:
            cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", tmp, str(root)]
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel produced"]
            raise ToolError(f"wheel build failed in {root}: {last[0]}")
        out_dir.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(wheels[0], out_dir / wheels[0].name))


def write_source_archive(root: Path, dest: Path) -> list[str]:
    """tar.gz of exactly the hashed files, as regular members with fixed times and owners,
    so the same content always gives the same archive bytes."""
    files = collect_files(root)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for rel, path in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.type = len(data), 0, tarfile.REGTYPE
            info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))
    with dest.open("wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    return [rel for rel, _ in files]


def requires_dist(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as whl:
        meta = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        if not meta:
            return []
        return Parser().parsestr(whl.read(meta[0]).decode()).get_all("Requires-Dist") or []


def runtime_hint(requirements: list[str]) -> str | None:
    """v1 when the package's own `verifiers` requirement has a floor >= 0.2.0 (the first release
    with `verifiers.v1`), v0 for any other pin, None without one: the rule `prime` applies."""
    floors: list[Version] = []
    found = False
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name.lower() != "verifiers" or req.url:
            continue
        if req.marker is not None and "extra" in str(req.marker) and not req.marker.evaluate({"extra": ""}):
            continue  # only an extra pulls it in
        found = True
        for spec in req.specifier:
            if spec.operator in (">=", ">", "==", "===", "~="):
                try:
                    floors.append(Version(spec.version.removesuffix(".*")))
                except InvalidVersion:
                    pass
    if not found:
        return None
    return VERIFIERS_V1 if floors and max(floors) >= Version("0.2.0") else VERIFIERS_V0


def build(root: Path, out_dir: Path | None = None) -> Artifact:
    """Wheel + source archive + content hash of the environment at `root`, written to `out_dir`
    (default `root/dist`, which the hash and the archive both leave out), with a manifest."""
    root = root.resolve()
    if not root.is_dir():
        raise ToolError(f"{root} is not a directory")
    project = read_project(root)
    if not list(root.glob("*.py")) and not any((d / "__init__.py").exists() for d in root.iterdir() if d.is_dir()):
        raise ToolError(f"{root} has no Python package (no top-level *.py, no <dir>/__init__.py)")
    out_dir = (out_dir or root / "dist").resolve()
    name, version = project["name"], str(project["version"])
    chash = content_hash(root)
    wheel = build_wheel(root, out_dir)
    source = out_dir / f"{name}-{version}.tar.gz"
    files = write_source_archive(root, source)
    reqs = requires_dist(wheel)
    metadata = {
        "description": project.get("description", ""),
        "tags": project.get("tags", []),
        "license": project.get("license", ""),
        "dependencies": project.get("dependencies", []),
        "python_requires": project.get("requires-python", ">=3.8"),
        "original_filename": wheel.name,
        "requires_dist": reqs,
    }
    art = Artifact(name, version, chash, wheel, sha256_file(wheel), source, sha256_file(source), files,
                   runtime_hint(reqs or project.get("dependencies", [])), metadata)
    (out_dir / MANIFEST).write_text(json.dumps(art.manifest(), indent=2) + "\n")
    return art

"""Install `owner/name@version` from the hub: resolve, download the wheel, check its sha256,
then `uv pip install` it into an interpreter (default: the one running this command) or a
`--target` directory."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from composer_prime.hub.artifact import sha256_file
from composer_prime.hub.errors import BAD_INPUT, REFUSED, ToolError
from composer_prime.hub.protocol import EnvRef, HubClient

log = logging.getLogger(__name__)


@dataclass
class Installed:
    ref: EnvRef
    version: str
    wheel: str
    sha256: str
    into: str


def _wheel_name(details: dict, url: str) -> str:
    # uv needs a real wheel filename to read the name/version/tags from
    name = details.get("wheel_filename") or Path(unquote(urlparse(url).path)).name
    if not name.endswith(".whl"):
        raise ToolError(f"hub wheel URL does not name a .whl file: {url}", REFUSED)
    return name


def install(ref: EnvRef, client: HubClient, python: str | None = None, target: Path | None = None,
            no_deps: bool = False, expected_sha256: str | None = None, verify: bool = True) -> Installed:
    details = client.details(ref)
    url = details.get("wheel_url")
    if not url:
        raise ToolError(f"{ref} has no wheel on the hub (a private source-only version?): try `prime env pull`", REFUSED)
    want = expected_sha256 or details.get("wheel_sha256")
    if verify and not want:
        raise ToolError(f"the hub gave no sha256 for the wheel of {ref}: pass --sha256 HEX (or --no-verify)")
    if not shutil.which("uv"):
        raise ToolError("uv is not on PATH (needed for `uv pip install`)")
    version = details.get("semantic_version") or ref.version
    with tempfile.TemporaryDirectory() as tmp:
        wheel = client.download(url, Path(tmp) / _wheel_name(details, url))
        got = sha256_file(wheel)
        if verify and got != want:
            raise ToolError(f"sha256 mismatch for {wheel.name}: hub says {want}, downloaded {got}; not installing", REFUSED)
        log.info(f"downloaded {wheel.name} (sha256 {got}{', verified' if verify else ', NOT verified'})")
        into = str(target) if target else (python or sys.executable)
        cmd = ["uv", "pip", "install", str(wheel), "--reinstall-package", ref.name]
        cmd += ["--target", into] if target else ["--python", into]
        cmd += ["--no-deps"] if no_deps else []
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["uv pip install failed"])[-1]
            raise ToolError(f"uv pip install of {wheel.name} failed: {last}", BAD_INPUT)
    return Installed(ref, version, wheel.name, got, into)

"""Each source's own test environment: pytest, coverage and the project's declared runtime and
test requirements (requirements.py), installed with uv into `<set>/testenv/site` for the
sandbox's interpreter. Never the project itself, not even as a dependency of a test requirement
(freezegun needs python-dateutil): such a dependency imports the tree's copy.

The sandbox mounts that directory read-only at /sandbox/site for every run of the suite: the
baseline, the gates, the agent's `run_tests` and scoring, so a task is built and scored against
the same packages. Nothing in the sandbox reaches the network; everything is installed here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from feature_deletion.baseline import BuildError
from feature_deletion.requirements import Declared, normalize
from feature_deletion.sandbox_layout import interpreter

ALWAYS = ["pytest", "coverage"]
# Plugins that reorder the tests by being loaded are never loaded by default. The others do
# nothing unless asked (`--cov`, `-n`, `--reruns` lived in the addopts switched off) but may
# register markers or fixtures the project's tests and conftest.py use.
NOT_LOADED = ("pytest_randomly", "random_order")
SITE = "site"


@dataclass
class TestEnv:
    site: Path                                          # what the sandbox mounts at /sandbox/site
    requirements: list[str]                             # what was asked of uv
    installed: dict[str, str] = field(default_factory=dict)   # distribution -> version
    plugins: dict[str, str] = field(default_factory=dict)     # pytest11 entry point -> module

    def loaded_plugins(self) -> list[str]:
        """The modules `-p` loads by default: every plugin the environment provides but those
        in NOT_LOADED."""
        mods = {m for m in self.plugins.values() if not m.split(".")[0].startswith(NOT_LOADED)}
        return sorted(mods)

    def record(self) -> dict:
        return {"requirements": self.requirements, "installed": self.installed, "plugins": self.plugins}


def _uv() -> str:
    uv = shutil.which("uv")
    if not uv:
        raise BuildError("uv is needed to install each source's test environment and is not on PATH")
    return uv


def _why(output: str) -> str:
    """uv's reason on one line: its error lines without the box drawing."""
    lines = [re.sub(r"^[\s×╰─▶│]+", "", ln).strip() for ln in output.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(("Using ", "Resolved ", "Prepared ", "warning:"))]
    text = " ".join(lines)
    return text[:400] + ("..." if len(text) > 400 else "")


def _install(site: Path, reqs: list[str], own: set[str], detail: Callable[[str], None]) -> tuple[bool, str]:
    req_file, never = site.parent / "requirements.txt", site.parent / "never.txt"
    req_file.write_text("".join(r + "\n" for r in reqs))
    # A test dependency may depend on the project (freezegun on python-dateutil): it gets the
    # tree's copy, never an installed one. An override that can never apply keeps it out.
    never.write_text("".join(f'{name} ; sys_platform == "never"\n' for name in sorted(own)))
    cmd = [_uv(), "pip", "install", "--python", interpreter()[0], "--target", str(site), "--no-progress",
           "-r", str(req_file), "--overrides", str(never)]
    # cwd away from any project: uv would read a pyproject.toml or uv.toml found above it
    with tempfile.TemporaryDirectory(prefix="fd-uv-") as cwd:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
        res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    detail(f"$ {' '.join(cmd)}\n{res.stdout}{res.stderr}")
    return res.returncode == 0, _why(res.stderr or res.stdout)


def _dists(site: Path) -> tuple[dict[str, str], dict[str, str]]:
    installed, plugins = {}, {}
    for info in sorted(site.glob("*.dist-info")):
        name, _, version = info.name.removesuffix(".dist-info").partition("-")
        installed[normalize(name)] = version
        eps = info / "entry_points.txt"
        if eps.is_file():
            section = ""
            for line in eps.read_text(errors="replace").splitlines():
                line = line.strip()
                if line.startswith("["):
                    section = line.strip("[]").strip()
                elif section == "pytest11" and "=" in line:
                    ep, target = (x.strip() for x in line.split("=", 1))
                    plugins[ep] = target.split(":", 1)[0].strip()
    return installed, plugins


def _owner(site: Path, module: str) -> str:
    for record in site.glob("*.dist-info/RECORD"):
        text = record.read_text(errors="replace")
        if re.search(rf"^{re.escape(module)}(/|\.py,)", text, re.M):
            return record.parent.name.removesuffix(".dist-info")
    return "an unknown distribution"


def build_env(dest: Path, declared: Declared, extra: list[str], modules: list[str], use_declared: bool,
              log: Callable[[str], None], detail: Callable[[str], None]) -> TestEnv:
    """Install into `dest/site`. Tries the declared runtime + test requirements, then the runtime
    ones alone (a test extra may hold something that no longer installs); raises BuildError with
    uv's reason when neither installs, or when a dependency brings the project's own module."""
    own = [r for r in extra if normalize(re.split(r"[\s<>=!~;\[@]", r, maxsplit=1)[0]) in declared.names]
    if own:
        raise BuildError(f"--deps names the project itself ({', '.join(own)}): it is never installed")
    tiers = [declared.requirements(True), declared.requirements(False)] if use_declared else [[]]
    tiers = [t for i, t in enumerate(tiers) if t not in tiers[:i]]
    first_error = ""
    for tier in tiers:
        reqs = list(dict.fromkeys([*ALWAYS, *tier, *extra]))
        shutil.rmtree(dest, ignore_errors=True)
        (dest / SITE).mkdir(parents=True)
        log(f"test environment: installing {len(reqs)} requirements with uv: {' '.join(reqs)}")
        # pytest and coverage run the suite: never overridden away, so a project named like one
        # of them is caught by the clash check below instead of failing later inside pytest
        own_names = (declared.names | {normalize(m) for m in modules}) - set(ALWAYS)
        ok, why = _install(dest / SITE, reqs, own_names, detail)
        if ok:
            break
        first_error = first_error or why
        log(f"test environment: uv failed ({why})")
    else:
        raise BuildError(f"cannot install the test environment: {first_error}")
    site = dest / SITE
    clash = [m for m in modules if (site / m).exists() or (site / f"{m}.py").exists()]
    if clash:
        raise BuildError(f"the test environment would hold the project's own module {clash[0]} "
                         f"(installed by {_owner(site, clash[0])}): pass --deps without it and --ignore-declared-deps")
    installed, plugins = _dists(site)
    return TestEnv(site, reqs, installed, plugins)

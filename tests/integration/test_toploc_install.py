"""`composer-prime toploc install` (verify/install.py): in the project's environment it finds
toploc already there; in a fresh environment with only torch (the project's torch build) it
installs the prebuilt wheel from ../shared/wheels where that exists, else builds toploc from its
sdist; either way toploc then imports with its C++ extension and builds a 258-byte proof. And the
install step has corrected every installed wheel whose WHEEL file misstates its tags (utils/wheel_tags.py)."""

import os
import shutil
import subprocess
import sys
import tomllib

import torch

from composer_prime.utils.wheel_tags import fix_here
from composer_prime.verify.install import DEFAULT_WHEELS, wheels_for_this_python
from tests.conftest import ROOT

UV = os.environ.get("UV") or shutil.which("uv")


def test_install_is_idempotent_and_finds_the_prebuilt_wheel(tmp_path):
    r = subprocess.run([UV, "run", "--no-sync", "composer-prime", "toploc", "install"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("toploc already importable"), r.stdout + r.stderr
    assert fix_here() == []  # the install step left no wheel whose tags uv would reinstall it for at every run

    venv = tmp_path / "venv"
    subprocess.run([UV, "venv", "-q", str(venv), "--python", sys.executable], check=True)
    python = str(venv / "bin" / "python")
    links = [f"--find-links={d}" for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["find-links"]
             if os.path.isdir(d)]
    subprocess.run([UV, "pip", "install", "-q", "--python", python, *links, f"torch=={torch.__version__}", "numpy"], check=True)
    # bytecode written in the fresh venv: its torch, compiled by the install's import check, is read by the proof below
    # (with PYTHONDONTWRITEBYTECODE, as this machine kind sets it, each of the two compiled torch again)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PATH"] = f"{venv / 'bin'}:{os.environ['PATH']}"
    r = subprocess.run([python, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from composer_prime.verify.install import "
                        "install; print(install())", str(ROOT)], capture_output=True, text=True, timeout=1200, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    said = r.stdout.strip().splitlines()[-1]
    if wheels_for_this_python(DEFAULT_WHEELS):
        assert said == f"toploc installed from {wheels_for_this_python(DEFAULT_WHEELS)[0]}"
    else:
        assert said.startswith("toploc 0.1.6 built from source")
    proof = subprocess.run([python, "-c", "import torch, base64, toploc; states = [torch.randn(128, dtype=torch.bfloat16) "
                            "for _ in range(5)]; print(len(base64.b64decode(toploc.build_proofs_base64(states, 32, 128, "
                            "skip_prefill=True)[0])))"], capture_output=True, text=True, env=env)
    assert proof.stdout.strip() == "258", proof.stderr[-2000:]


def test_only_wheels_for_this_python_are_taken(tmp_path):
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for name in (f"toploc-0.1.6-{tag}-{tag}-linux_x86_64.whl", "toploc-0.1.6-cp39-cp39-linux_x86_64.whl",
                 f"toploc-0.1.5-{tag}-{tag}-linux_x86_64.whl"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in wheels_for_this_python(tmp_path)] == [f"toploc-0.1.6-{tag}-{tag}-linux_x86_64.whl"]
    assert wheels_for_this_python(tmp_path / "absent") == []

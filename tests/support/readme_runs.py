"""The README's commands run as a newcomer types them: `uv run ...` from a working directory that holds
only the repository's configs (and its test fixtures, which one README example reads), each command
followed by what a test appends (a few steps, free ports). Used by test_readme.py and by the session's
runs that other tests read (shared_runs.py)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port

README = (ROOT / "README.md").read_text()


def small_rl() -> list[str]:
    """What a test appends to a README `rl` command: 2 steps, free ports, a held-out evaluation of 16 tasks every step."""
    return ["--max_steps", "2", "--inference.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}",
            "--orchestrator.eval.num_tasks", "16", "--orchestrator.eval.interval", "1"]


def bare_work_dir(parent: Path) -> Path:
    work = parent / "work"
    work.mkdir()
    (work / "configs").symlink_to(ROOT / "configs")
    (work / "tests").symlink_to(ROOT / "tests")  # the README's trace example reads the repository's fixtures
    return work


def run_commands(commands: Sequence[tuple[str, Callable[[], list[str]]]], work: Path) -> Path:
    """Run each (README command, appended arguments) in `work`, in order; each must exit 0. Returns `work`."""
    uv = shutil.which("uv") or pytest.fail("uv is not on PATH (the README's commands need it)")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for command, extra in commands:
        assert command in README, f"the README no longer says: {command}"
        argv = shlex.split(command)
        assert argv[:2] == ["uv", "run"]
        # --no-sync: the environment is the one the test suite runs in; --project: the repository
        full = [uv, "run", "--no-sync", "--project", str(ROOT), *argv[2:], *extra()]
        r = subprocess.run(full, cwd=work, env=env, capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, f"{command}\n{(r.stdout + r.stderr)[-3000:]}"
    return work

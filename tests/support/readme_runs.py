"""The README's commands run as a newcomer types them: `uv run ...` from a working directory that holds
only the repository's configs (and its test fixtures, which one README example reads), each command
followed by what a test appends (a few steps, free ports). `SEQUENCES`: the README's example sequences,
run by test_readme.py, test_readme_rl.py and test_readme_feature_deletion.py (test_readme.py checks that
every README command is run by one of them, by the session's runs that other tests read (shared_runs.py),
or by a test it names)."""

from __future__ import annotations

import json
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
    """What a test appends to a README `rl` command: 2 steps, free ports, a held-out evaluation of 16 tasks at the
    first and the last step only (an interval past the run's end: the orchestrator always evaluates at both)."""
    return ["--max_steps", "2", "--inference.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}",
            "--orchestrator.eval.num_tasks", "16", "--orchestrator.eval.interval", "1000"]


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


# per sequence: the README's commands (verbatim, up to any comment), then what a test run appends. The distill
# sequence is the session's `tool_calc_warm_start` and `tool_calc_distill_run` (shared_runs.py).
SEQUENCES = {
    # quickstart and shardcast: 2 groups of 8 a step (the config's 128 rollouts: nothing asserted of them)
    "quickstart": [("uv run rl @ configs/quickstart.toml", lambda: [*small_rl(), "--orchestrator.batch_size", "16"])],
    "config": [("uv run rl @ configs/quickstart.toml --trainer.optim.lr 3e-5 --max_steps 50 --dry-run", list),
               ("uv run rl --help", list)],
    "mix": [("uv run rl @ configs/mix.toml", lambda: [*small_rl(), "--orchestrator.batch_size", "32"])],
    # the README claims a model directory: 2 steps of 4 of 16 demonstrations write one as 100 of 16 would
    "sft": [("uv run python -m tool_calc.demos --out outputs/examples.jsonl", lambda: ["-n", "16"]),
            ("uv run sft --data outputs/examples.jsonl --model tiny --output_dir outputs/sft --max_steps 100",
             lambda: ["--max_steps", "2", "--batch_size", "4"])],
    "hub": [("uv run composer-prime env init my-env", list), ("uv run composer-prime env validate environments/my-env", list),
            ("uv run composer-prime env build environments/my-env", list),
            ("uv run composer-prime env publish environments/my-env", list)],
    "traces": [("uv run composer-prime traces ingest tests/fixtures/traces --out outputs/traces.jsonl", list)],
    "shardcast": [("uv run rl @ configs/quickstart.toml @ configs/shardcast.toml",
                   lambda: [*small_rl(), "--weight_broadcast.port", str(free_port()), "--orchestrator.batch_size", "16"])],
    # the sdist comes from PyPI at test time (test_readme_feature_deletion also checks this build as the generator's
    # real-sdist test); two attacks, not fifteen
    "feature-deletion": [
        ("uv run composer-prime env build-tasks feature-deletion --source pypi:inflection==0.5.1 --out outputs/tasks/inflection",
         list),
        ("uv run composer-prime env redteam outputs/tasks/inflection",
         lambda: ["--attacks", "copy_original_from_host,edit_and_delete_tests", "--json", "outputs/redteam.json"]),
        ("uv run rl @ configs/feature-deletion.toml",
         lambda: [*small_rl(), "--orchestrator.eval.num_tasks", "1", "--orchestrator.sampling.max_tokens", "32"])],
}


def run_sequence(name: str, tmp_path: Path) -> Path:
    """Run the sequence in a fresh working directory (the repository's configs, nothing else)."""
    return run_commands(SEQUENCES[name], bare_work_dir(tmp_path))


def rows(path: Path) -> list[dict]:
    """A JSONL file's rows (a run's metrics.jsonl)."""
    return [json.loads(ln) for ln in path.read_text().splitlines()]

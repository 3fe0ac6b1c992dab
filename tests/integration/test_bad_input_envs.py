"""Bad input about environments, tried as a new user would: the real command as a subprocess
must exit 2 with one line on stderr naming the environment (and the argument), no traceback,
and nothing written. `rl`'s rows run its `resolve` in-process (everything `rl` checks before a process
starts; a traceback would be an exception here, not exit 2; the real `rl` command's one-line wrapper
is tried as a subprocess in test_bad_input.py and test_config_cli.py). (The rows of the other commands
are in tests/integration/test_bad_input.py.)"""

import sys
from pathlib import Path

import pytest

from composer_prime.entrypoints.rl import resolve
from composer_prime.hub.scaffold import scaffold
from tests.conftest import ROOT
from tests.support import forkserver

QUICKSTART = ["@", "configs/quickstart.toml", "--dry-run"]


@pytest.fixture(scope="module")
def envs(tmp_path_factory) -> Path:
    """Scaffolded environments whose own code fails: an assertion on an argument, a missing dependency."""
    parent = tmp_path_factory.mktemp("envs")
    for name, old, new in (
            ("asserting-env", "        rng = random.Random(self.config.seed)\n",
             '        assert self.config.num_tasks <= 1000, "num_tasks must be at most 1000"\n'
             "        rng = random.Random(self.config.seed)\n"),
            ("needy-env", "import verifiers.v1 as vf\n", "import verifiers.v1 as vf\nimport no_such_dependency_xyz\n")):
        taskset = scaffold(name, parent) / name.replace("-", "_") / "taskset.py"
        taskset.write_text(taskset.read_text().replace(old, new, 1))
    return parent


ROWS = {
    "rl: environment not installed": (
        ["rl", *QUICKSTART, "--orchestrator.envs", '[{id="nonexistent-env"}]'],
        ["orchestrator.envs[0]", "'nonexistent-env' is not installed", "uv pip install <directory, wheel or name>"]),
    "rl: environment arg unknown": (
        ["rl", *QUICKSTART, "--orchestrator.envs", '[{id="reverse-text", args={no_such=1}}]'],
        ["orchestrator.envs[0].args", "'reverse-text'", "no_such: Extra inputs are not permitted"]),
    "rl: held-out arg of the wrong type": (
        ["rl", *QUICKSTART, "--orchestrator.envs", '[{id="reverse-text", eval_args={num_tasks="many"}}]'],
        ["orchestrator.envs[0].eval_args", "'reverse-text'", "num_tasks: Input should be a valid integer"]),
    "env validate: not installed": (
        ["cli", "env", "validate", "nonexistent-env"], ["'nonexistent-env' is not installed", "uv pip install"]),
    "env validate: the environment's own assertion": (
        ["cli", "env", "validate", "asserting-env", "--args", '{"num_tasks": 5000}'],
        ["'asserting-env'", "num_tasks=5000", "AssertionError: num_tasks must be at most 1000",
         "asserting_env/taskset.py:"]),
    "orchestrator: the environment's own assertion": (
        ["orchestrator", "--envs", '[{id="asserting-env", args={num_tasks=5000}}]'],
        ["'asserting-env'", "num_tasks=5000", "AssertionError: num_tasks must be at most 1000"]),
    "env validate: a dependency missing": (
        ["cli", "env", "validate", "needy-env"], ["'needy-env' imports 'no_such_dependency_xyz', which is not installed"]),
}


@pytest.mark.parametrize("row", list(ROWS))
def test_bad_environment_input_is_one_line_and_exit_2(row, envs, tmp_path, capsys, monkeypatch):
    (entrypoint, *argv), expected = ROWS[row]
    if entrypoint != "cli":
        argv += ["--output_dir", str(tmp_path / "run")]
    if entrypoint == "rl":
        monkeypatch.chdir(ROOT)
        with pytest.raises(SystemExit) as e:
            resolve(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and err.count("\n") == 0 and all(x in err for x in expected), err
        assert not (tmp_path / "run").exists()
        return
    env = {"PYTHONPATH": f"{envs / 'asserting-env'}:{envs / 'needy-env'}", "PATH": "/usr/bin:/bin",
           "HOME": str(Path.home()), "HF_HUB_OFFLINE": "1"}
    r = forkserver.run([sys.executable, "-m", f"composer_prime.entrypoints.{entrypoint}", *argv], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    err = r.stderr.strip()
    assert r.returncode == 2 and err.count("\n") == 0 and "Traceback" not in err, (r.returncode, r.stderr[-3000:])
    assert all(x in err for x in expected), err
    assert not (tmp_path / "run").exists()  # nothing half-written

"""Fixture projects built to trip a generator or a red team written for one layout (see their
READMEs): `deplib`, whose code and tests need packages from PyPI (a runtime dependency, and a
pytest plugin from a test extra that also names the project itself), and `srclib` (a src/ layout,
a `test/` directory, `--cov` in its addopts with no pytest-cov anywhere, parametrised test ids, a
test class, functions in `__init__.py`). Each builds, its tasks score 0 broken and exactly 1.0
restored in the sandbox (as the generator checked it; as written, by score_task here or by the red
team's honest and untouched runs), and the red team stops every attack on it for the intended reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from feature_deletion.redteam import audit_task
from feature_deletion.redteam_controls import ATTACKS
from feature_deletion.scoring import score_task
from sandbox_support import DEPLIB, REDTEAM_LIMITS as LIMITS, REDTEAM_TIMEOUTS as TIMEOUTS, SRCLIB, build_in

quiet = lambda m: None  # noqa: E731
NEUTRAL = ["-o", "addopts=", "-o", "required_plugins="]
# Denials of service do not depend on the layout and cost a timeout each: they run on minilib.
DOS = ("fork_bomb", "memory_hog", "infinite_loop")


@pytest.fixture(scope="module")
def deplib(tmp_path_factory) -> tuple[dict, Path]:
    return build_in(tmp_path_factory, "deplib", DEPLIB)


@pytest.fixture(scope="module")
def srclib(tmp_path_factory) -> tuple[dict, Path]:
    return build_in(tmp_path_factory, "srclib", SRCLIB)


# The tasks test_red_team_stops_every_attack_for_its_reason audits: there the untouched repo must score a clean
# 0 and the honest agent's restored function exactly 1.0, so they are not scored again here.
AUDITED = {"srclib--parse_offset--body", "srclib.durations--to_seconds--body", "deplib.config--dump_config--body"}


def scores(task_dir: Path, tmp_path: Path) -> tuple[float, float]:
    """(the broken repo's reward, the reward with the solution restored), both from score_task."""
    fixed = tmp_path / f"fixed-{task_dir.name}"
    shutil.copytree(task_dir / "repo", fixed)
    shutil.copytree(task_dir / "solution", fixed, dirs_exist_ok=True)
    return score_task(task_dir, task_dir / "repo").reward, score_task(task_dir, fixed).reward


def check_scores(m: dict, out: Path, tmp_path: Path) -> None:
    """Every task as the generator checked it (0 broken, 1.0 restored), and as written, scored here or audited."""
    assert [t["checked"] for t in m["tasks"]] == [{"broken": 0.0, "restored": 1.0}] * len(m["tasks"])
    for t in m["tasks"]:
        if t["id"] not in AUDITED:
            assert scores(out / "tasks" / t["id"], tmp_path) == (0.0, 1.0)


def test_deplib_builds_with_its_dependencies_in_the_sandbox(deplib, tmp_path):
    m, out = deplib
    assert sorted(t["id"] for t in m["tasks"]) == ["deplib.config--dump_config--body", "deplib.config--flatten--body",
                                                   "deplib.config--merge--body"]
    assert m["report"]["tests_stable_passing"] == 20 and m["report"]["rejected"] == {}
    env = m["testenv"]
    assert env["requirements"] == ["pytest", "coverage", "tomli-w>=1.0", "pytest-mock>=3.10", "tomli-w"]
    assert "tomli-w" in env["installed"] and "pytest-mock" in env["installed"] and "deplib" not in env["installed"]
    assert env["plugins"] == {"pytest_mock": "pytest_mock"}
    dump = next(t for t in m["tasks"] if t["qualname"] == "dump_config")
    assert dump["pytest_args"] == [*NEUTRAL, "-p", "pytest_mock", "tests"]
    assert "tests/test_config.py::test_dump_calls_tomli_w_once" in dump["tests"]  # needs the plugin's `mocker`
    check_scores(m, out, tmp_path)


def test_srclib_builds_whatever_its_layout_and_addopts(srclib, tmp_path):
    m, out = srclib
    by_name = {t["qualname"]: t for t in m["tasks"]}
    assert sorted(by_name) == ["format_offset", "parse_offset", "to_seconds"]
    assert by_name["parse_offset"]["file"] == "src/srclib/__init__.py"
    assert by_name["parse_offset"]["tests"] == [f"test/test_offsets.py::test_parse_offset[{x}]"
                                                 for x in ("+0000", "+0530", "-0800")]
    assert by_name["to_seconds"]["tests"] == [f"test/test_durations.py::TestToSeconds::{n}"
                                              for n in ("test_bad_unit", "test_days", "test_hours_minutes")]
    assert by_name["to_seconds"]["pytest_args"] == [*NEUTRAL, "-o", "pythonpath=src", "test"]
    assert by_name["to_seconds"]["test_paths"] == ["setup.cfg", "test"]
    check_scores(m, out, tmp_path)


@pytest.mark.parametrize("fixture, task, attacks", [
    ("srclib", "srclib--parse_offset--body", [a for a in ATTACKS if a not in DOS]),  # __init__.py, test/, ids
    ("srclib", "srclib.durations--to_seconds--body", ["rewrite_tests_at_runtime"]),  # tests inherited from another file
    ("deplib", "deplib.config--dump_config--body", [a for a in ATTACKS if a not in DOS]),  # a plugin and a dependency
])
def test_red_team_stops_every_attack_for_its_reason(fixture, task, attacks, request):
    _, out = request.getfixturevalue(fixture)
    results = audit_task(out / "tasks" / task, attacks, LIMITS, TIMEOUTS, log=quiet)
    assert [(o.attack, o.score, o.ok) for o in results] == [("honest", 1.0, True)] + [(a, 0.0, True) for a in attacks], \
        [(o.attack, o.problem) for o in results if not o.ok]
    assert all(o.stopped_by == ATTACKS[o.attack].defence for o in results[1:])


def cli(argv: list[str], capsys) -> tuple[int, str]:
    from composer_prime.entrypoints.cli import main

    with pytest.raises(SystemExit) as e:
        main(["env", "build-tasks", "feature-deletion", *argv])
    return e.value.code, capsys.readouterr().err


def test_keeping_the_projects_addopts_fails_with_pytests_own_reason(tmp_path, capsys):
    out = tmp_path / "out"
    code, err = cli(["--source", str(SRCLIB), "--out", str(out), "--keep-pytest-config"], capsys)
    last = err.splitlines()[-1]
    assert code == 2 and last.startswith("error: the test suite does not run: pytest exited 4")
    assert "unrecognized arguments: --cov=srclib" in last and f"(full output: {out}.build.log)" in last
    log = Path(f"{out}.build.log").read_text()
    assert "usage:" in log and "inifile:" in log and "unrecognized arguments: --cov=srclib" in log
    assert not out.exists()


def test_a_dependency_that_does_not_install_is_one_clear_error(tmp_path, capsys):
    out = tmp_path / "out"
    code, err = cli(["--source", str(DEPLIB), "--out", str(out), "--deps", "fd-no-such-package-3b1f==1.0"], capsys)
    last = err.splitlines()[-1]
    assert code == 2 and last.startswith("error: cannot install the test environment:")
    assert "fd-no-such-package-3b1f" in last and "Traceback" not in err and not out.exists()


def test_deps_naming_the_project_are_refused(tmp_path, capsys):
    code, err = cli(["--source", str(DEPLIB), "--out", str(tmp_path / "out"), "--deps", "deplib>=0.1"], capsys)
    assert code == 2 and err.splitlines()[-1] == "error: --deps names the project itself (deplib>=0.1): it is never " \
        f"installed (full output: {tmp_path / 'out'}.build.log)"

"""score_task: a fresh copy, only admissible source changes, outcomes only from the JUnit XML."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from feature_deletion.scoring import (ScoreConfig, junit_outcomes, overlay, protected_paths, score_task,
                                      source_roots)
from feature_deletion.taskdir import load_task
from feature_deletion.hostguard import tree_digest
from sandbox_support import HANDMADE_TASK, MEAN_TESTS, STATS_PARTIAL, STATS_SOLUTION, write_tree



def agent_copy(task_dir: Path, tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    repo = tmp_path / "agent"
    shutil.copytree(task_dir / "repo", repo)
    write_tree(repo, files or {})
    return repo


@pytest.fixture
def task_dir(handmade_taskset: Path) -> Path:
    return handmade_taskset / "tasks" / HANDMADE_TASK


def test_untouched_broken_repo_scores_zero(task_dir: Path, tmp_path: Path) -> None:
    s = score_task(task_dir, agent_copy(task_dir, tmp_path))
    assert (s.reward, s.passed, sorted(s.failed), s.regressions) == (0.0, [], sorted(MEAN_TESTS), [])
    assert s.details["tampered"] is None and s.details["report_problem"] is None


def test_restored_solution_scores_one(task_dir: Path, tmp_path: Path) -> None:
    agent = agent_copy(task_dir, tmp_path, {"tinylib/stats.py": STATS_SOLUTION})
    before = (tree_digest(task_dir), tree_digest(agent))
    s = score_task(task_dir, agent)
    assert (s.reward, sorted(s.passed), s.failed, s.regressions) == (1.0, sorted(MEAN_TESTS), [], [])
    assert s.details["applied"] == ["tinylib/stats.py"]
    assert (tree_digest(task_dir), tree_digest(agent)) == before  # scoring changes neither


def test_partial_solution_scores_the_exact_fraction(task_dir: Path, tmp_path: Path) -> None:
    s = score_task(task_dir, agent_copy(task_dir, tmp_path, {"tinylib/stats.py": STATS_PARTIAL}))
    assert s.reward == 0.5
    assert sorted(s.passed) == ["tests/test_stats.py::test_mean_ints", "tests/test_stats.py::test_mean_single"]


def test_regression_zeroes_the_reward_unless_configured(task_dir: Path, tmp_path: Path) -> None:
    broken_double = STATS_SOLUTION.replace("return 2 * x", "return 3 * x")
    agent = agent_copy(task_dir, tmp_path, {"tinylib/stats.py": broken_double})
    s = score_task(task_dir, agent)
    assert s.reward == 0.0 and len(s.passed) == 4
    assert s.regressions == ["tests/test_stats.py::test_double", "tests/test_stats.py::test_double_str"]
    s = score_task(task_dir, agent, ScoreConfig(regressions_zero=False))
    assert s.reward == 1.0 and len(s.regressions) == 2


def test_a_test_missing_from_the_report_counts_as_failed(task_dir: Path, tmp_path: Path) -> None:
    task = load_task(task_dir)
    ghost = "tests/test_stats.py::test_mean_ghost"  # listed, but no such test exists to report
    task["tests"].append(ghost)
    (task_dir / "task.json").write_text(json.dumps(task))
    s = score_task(task_dir, agent_copy(task_dir, tmp_path, {"tinylib/stats.py": STATS_SOLUTION}))
    assert s.reward == pytest.approx(4 / 5) and s.failed == [ghost]


def test_no_report_scores_zero(task_dir: Path, tmp_path: Path) -> None:
    exits = STATS_SOLUTION + "\nimport os\nprint('4 passed')\nos._exit(0)\n"
    s = score_task(task_dir, agent_copy(task_dir, tmp_path, {"tinylib/stats.py": exits}))
    assert s.reward == 0.0 and s.details["report_problem"] == "no JUnit report"


def test_test_and_config_changes_do_not_cross_over(task_dir: Path, tmp_path: Path) -> None:
    trivial = "\n".join(f"def {t.split('::')[1]}():\n    pass\n" for t in MEAN_TESTS)
    hook = "def pytest_collection_modifyitems(items):\n    items.clear()\n"
    agent = agent_copy(task_dir, tmp_path, {"tests/test_stats.py": trivial, "conftest.py": hook,
                                            "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-p no:junitxml'\n"})
    s = score_task(task_dir, agent)
    assert s.reward == 0.0
    assert sorted(s.details["ignored"]) == ["conftest.py", "pyproject.toml", "tests/test_stats.py"]


def test_overlay_admits_only_package_sources(task_dir: Path, tmp_path: Path) -> None:
    pristine = task_dir / "repo"
    files = {
        "tinylib/stats.py": STATS_SOLUTION,  # the task's file: applied
        "tinylib/extra.py": "X = 1\n",  # a new module of the package: applied
        "tinylib/__init__.py": "from tinylib.stats import double, mean\nY = 2\n",  # applied
        "tinylib/conftest.py": "", "tinylib/sitecustomize.py": "", "tinylib/usercustomize.py": "",
        "tinylib/test_sneaky.py": "", "tinylib/sneaky_test.py": "", "tinylib/hook.pth": "import os",
        "tinylib/__pycache__/stats.cpython-311.pyc": "", "tinylib/stats.pyc": "", "tinylib/pytest.ini": "",
        "tinylib/sub/mod.py": "",  # not a package in the pristine tree
        "pytest.py": "", "json.py": "", "sitecustomize.py": "", "conftest.py": "", "setup.cfg": "",
        "tox.ini": "", "pytest.ini": "", "evil.pth": "", "_pytest/__init__.py": "", "tests/conftest.py": "",
        "tests/test_stats.py": "", "tests/helper.py": "", "other/__init__.py": "",
    }
    agent = agent_copy(task_dir, tmp_path, files)
    os.symlink("/etc/passwd", agent / "tinylib" / "linked.py")
    dest = tmp_path / "dest"
    shutil.copytree(pristine, dest)
    task = load_task(task_dir)
    assert source_roots(task, pristine) == ["tinylib"]
    applied, ignored = overlay(task, pristine, agent, dest)
    assert sorted(applied) == ["tinylib/__init__.py", "tinylib/extra.py", "tinylib/stats.py"]
    assert sorted(ignored) == sorted(set(files) - set(applied) | {"tinylib/linked.py"})
    assert not (dest / "tinylib" / "linked.py").exists()


@pytest.mark.parametrize("which", [0, 1])
def test_generator_built_tasks(minilib_taskset: Path, tmp_path: Path, which: int) -> None:
    task_dir = sorted((minilib_taskset / "tasks").iterdir())[which]
    task = load_task(task_dir)
    assert score_task(task_dir, agent_copy(task_dir, tmp_path / "broken")).reward == 0.0
    solution = {p.relative_to(task_dir / "solution").as_posix(): p.read_text()
                for p in (task_dir / "solution").rglob("*.py")}
    s = score_task(task_dir, agent_copy(task_dir, tmp_path / "fixed", solution))
    assert s.reward == 1.0 and sorted(s.passed) == sorted(task["tests"])


def test_report_must_be_a_plain_file(tmp_path: Path) -> None:
    """The code under test can write where the report goes: a link or a FIFO there is refused."""
    host = tmp_path / "host.xml"
    host.write_text('<testsuites><testsuite><testcase classname="t" name="x"/></testsuite></testsuites>')
    (tmp_path / "link.xml").symlink_to(host)
    os.mkfifo(tmp_path / "fifo.xml")
    (tmp_path / "doctype.xml").write_text('<!DOCTYPE x [<!ENTITY a "b">]><testsuites/>')
    assert junit_outcomes(tmp_path / "link.xml", tmp_path) == ({}, "JUnit report is not a regular file")
    assert junit_outcomes(tmp_path / "fifo.xml", tmp_path) == ({}, "JUnit report is not a regular file")
    assert junit_outcomes(tmp_path / "doctype.xml", tmp_path) == ({}, "JUnit report has a DOCTYPE")
    assert junit_outcomes(tmp_path / "missing.xml", tmp_path) == ({}, "no JUnit report")
    assert junit_outcomes(host, tmp_path) == ({"t::x": "passed"}, None)


def test_protected_paths(task_dir: Path, tmp_path: Path) -> None:
    repo = agent_copy(task_dir, tmp_path, {"tinylib/conftest.py": "", "tests/sub/conftest.py": ""})
    task = load_task(task_dir)
    assert protected_paths(task, repo, "x/test_c.py::test_c") == ["pyproject.toml", "tests", "tinylib/conftest.py", "x/test_c.py"]

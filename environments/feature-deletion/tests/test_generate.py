"""The Feature Deletion task generator on the `minilib` fixture (tests/fixtures/minilib, whose
traps are described in its README). A real PyPI sdist (inflection 0.5.1): the README's build, read by
tests/integration/test_readme_feature_deletion.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from feature_deletion.baseline import BuildError
from feature_deletion.deletion import apply_deletions, find_functions
from feature_deletion.gates import COLLATERAL, FAILS_BEFORE, NOT_FAILING, RESTORE_FAILS
from feature_deletion.generate import build
from feature_deletion.hostguard import tree_digest
from feature_deletion.sandbox import Limits
from feature_deletion.scoring import score_task
from feature_deletion.suite import Suite
from feature_deletion.taskdir import load_task
from sandbox_support import MINILIB, build_in, write_tree

ROOT = Path(__file__).resolve().parents[3]
quiet = lambda m: None  # noqa: E731


def without_timings(manifest: dict) -> dict:
    m = json.loads(json.dumps(manifest))
    m["report"].pop("seconds")
    return m


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> tuple[dict, Path]:
    return build_in(tmp_path_factory, "full", MINILIB)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[dict, Path]:
    # One task, two jobs: the second candidate is checked beside the first and thrown away (run_gates)
    return build_in(tmp_path_factory, "small", MINILIB, max_tasks=1)


# ------------------------------------------------------------------ the gates
# Each gate's rejection on the fixture function built to trip it (see the fixture's README),
# checked in the full build: every candidate was scored by the scorer itself.
def test_gates_reject_each_fixture_trap_for_its_reason(full):
    manifest, out = full
    assert sorted(manifest["report"]["gate_rejections"], key=lambda g: g["function"]) == [
        {"function": "minilib.numeric._parse_plain", "reason": NOT_FAILING,  # parse_number falls back to _parse_grouped
         "detail": "0/4 tests fail after deletion"},
        {"function": "minilib.registry.lookup", "reason": FAILS_BEFORE,  # needs test_register_handlers to run first
         "detail": "tests fail when run on their own: 2, e.g. tests/test_registry.py::test_lookup_dotted"},
        {"function": "minilib.report.TextTable._render_lines", "reason": RESTORE_FAILS,  # a failed render leaves its lock
         "detail": "tests still fail after a failed run and a restore: 4, e.g. tests/test_report.py::test_render"},
        {"function": "minilib.units.build_table", "reason": COLLATERAL,  # runs at import: every test fails
         "detail": "other tests fail: 51, e.g. tests/test_numeric.py::test_clamp_inside"}]


def test_gates_accept_a_sound_deletion_checked_by_the_scorer(full, tmp_path):
    manifest, out = full
    task = next(t for t in manifest["tasks"] if t["qualname"] == "TextTable.from_records")
    assert task["tests"] == ids("test_report.py", "test_from_records", "test_from_records_columns",
                                "test_from_records_missing_key")
    assert task["checked"] == {"broken": 0.0, "restored": 1.0}
    d = out / "tasks" / task["id"]
    assert score_task(d, d / "repo").reward == 0.0
    fixed = tmp_path / "fixed"
    shutil.copytree(d / "repo", fixed)
    shutil.copytree(d / "solution", fixed, dirs_exist_ok=True)
    assert score_task(d, fixed).reward == 1.0


def ids(module: str, *names: str) -> list[str]:
    return [f"tests/{module}::{n}" for n in names]


# ------------------------------------------------------------------ body replacement
def test_body_replacement_keeps_decorators_signature_docstring(full):
    _, out = full
    task = out / "tasks" / "minilib.report--TextTable.from_records--body"
    broken = (task / "repo" / "minilib" / "report.py").read_text()
    original = (MINILIB / "minilib" / "report.py").read_text()
    head = original[:original.index("    @staticmethod")]
    assert broken == head + (
        "    @staticmethod\n"
        "    def from_records(records: list[dict],\n"
        "                     columns: list[str] | None = None) -> \"TextTable\":\n"
        "        \"\"\"Build a table from dicts; columns default to the first record's keys.\"\"\"\n"
        "        raise NotImplementedError\n")
    assert (task / "solution" / "minilib" / "report.py").read_text() == original
    code = ("import minilib, inspect\n"
            "print(inspect.signature(minilib.TextTable.from_records), minilib.TextTable.from_records.__doc__)\n"
            "try:\n    minilib.TextTable.from_records([])\nexcept NotImplementedError:\n    print('raises')\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=task / "repo", capture_output=True, text=True,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert res.stdout.splitlines() == [
        "(records: list[dict], columns: list[str] | None = None) -> 'TextTable' "
        "Build a table from dicts; columns default to the first record's keys.", "raises"], res.stderr
    # Every other file of the task's repo is the pristine fixture's; only report.py is in solution/.
    files = sorted(p.relative_to(MINILIB) for p in MINILIB.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert files == sorted(p.relative_to(task / "repo") for p in (task / "repo").rglob("*") if p.is_file())
    changed = [f for f in files if (MINILIB / f).read_bytes() != (task / "repo" / f).read_bytes()]
    solution = [p.relative_to(task / "solution") for p in (task / "solution").rglob("*") if p.is_file()]
    assert changed == solution == [Path("minilib/report.py")]


def test_replace_body_without_docstring_and_one_liners():
    src = ("class A:\n    def f(self, x):\n        # how\n        y = x + 1\n\n        return y\n        # end\n\n"
           "    def g(self): return 1\n")
    f, g = find_functions(src)
    assert apply_deletions(src, [(f, "body")]) == (
        "class A:\n    def f(self, x):\n        raise NotImplementedError\n\n    def g(self): return 1\n")
    assert (f.body_lines, g.body_lines, g.replaceable) == (2, 0, False)


# ------------------------------------------------------------------ report, reproducibility
def test_fixture_report_pinned(full):
    manifest, out = full
    r = manifest["report"]
    assert without_timings(manifest)["report"] | {"rejected_examples": None, "gate_rejections": None} == {
        "tests_collected": 56, "tests_stable_passing": 54,
        "unstable": ["tests/test_misc.py::test_flaky_median"],
        "baseline_failing": ["tests/test_text.py::test_word_wrap_empty_known_bug"], "tests_skipped": 0,
        "candidates": 26, "accepted": 10,
        "rejected": {"collateral_failures": 1, "fails_before": 1, "not_failing_after_deletion": 1,
                     "restore_fails": 1, "too_few_tests": 3, "too_long": 1, "too_many_tests": 1,
                     "too_short": 6, "unstable_tests": 1},
        "rejected_examples": None, "gate_rejections": None, "passed_filters": 14, "evaluated": 14, "not_evaluated": 0}
    assert r["rejected_examples"]["collateral_failures"] == ["minilib.units.build_table"]
    assert r["rejected_examples"]["too_many_tests"] == ["minilib.text._normalize"]
    assert r["rejected_examples"]["too_long"] == ["minilib.numeric.number_name"]
    assert r["candidates"] == r["accepted"] + sum(r["rejected"].values()) + r["not_evaluated"]
    assert sorted(t["id"] for t in manifest["tasks"]) == sorted(p.name for p in (out / "tasks").iterdir())
    for t in manifest["tasks"]:
        assert load_task(out / "tasks" / t["id"]) == t
        assert t["n_tests"] == len(t["tests"]) >= 3 and set(t["tests"]) <= set(t["baseline_passing"])
        assert t["test_paths"] == ["pyproject.toml", "tests"] and t["testenv"] == "../../testenv/site"
        assert t["pytest_args"] == ["-o", "addopts=", "-o", "required_plugins=", "tests"]  # no plugin installed
        assert t["checked"] == {"broken": 0.0, "restored": 1.0} and t["pytest_autoload"] is False
    assert sorted(manifest["testenv"]["installed"]) == ["coverage", "iniconfig", "packaging", "pluggy", "pygments", "pytest"]
    assert (out / "testenv" / "site" / "pytest").is_dir() and not (out / "testenv" / "site" / "minilib").exists()


def test_other_seed_other_choice(small, tmp_path):
    # the same seed gives the same set, whatever --jobs: test_cli_builds_the_same_set_as_the_api's build.
    # Seed 0 takes minilib.numeric.from_roman first, seed 1 minilib.units.convert (one task each: one check)
    other = build(str(MINILIB), tmp_path / "other", seed=1, max_tasks=1, log=quiet)
    assert len(other["tasks"]) == len(small[0]["tasks"]) == 1
    assert [t["id"] for t in other["tasks"]] != [t["id"] for t in small[0]["tasks"]]


def test_with_helpers_deletes_the_helpers_too(tmp_path):
    m = build(str(MINILIB), tmp_path / "h", seed=0, variant="with_helpers", jobs=2, log=quiet)
    by_id = {t["id"]: t for t in m["tasks"]}
    assert sorted(by_id) == ["minilib.numeric--parse_number--with_helpers", "minilib.report--TextTable.render--with_helpers",
                             "minilib.text--slugify--with_helpers", "minilib.text--title_case--with_helpers"]
    t = by_id["minilib.text--slugify--with_helpers"]
    assert [(d["qualname"], d["kind"]) for d in t["deleted"]] == [("slugify", "body"), ("_collapse_separators", "removed")]
    text = (tmp_path / "h" / "tasks" / t["id"] / "repo" / "minilib" / "text.py").read_text()
    assert "_collapse_separators" not in text and "def _normalize" in text
    assert ('def slugify(text, sep="-"):\n    """\'Hello, World!\' -> \'hello-world\' (at most 60 characters)."""\n'
            "    raise NotImplementedError\n\n\ndef _is_small") in text
    assert t["tests"] == ids("test_text.py", "test_slugify_basic", "test_slugify_custom_separator",
                             "test_slugify_empty", "test_slugify_long_text_is_cut")
    assert m["report"]["rejected"] == {"no_private_helpers": 22}


# ------------------------------------------------------------------ CLI
def test_cli_builds_the_same_set_as_the_api(small, tmp_path, capsys):
    # one job here, two in `small`: the same seed gives the same manifest and the same files whatever the jobs.
    # In-process (the command as a process: test_cli_bad_input_as_a_subprocess)
    from composer_prime.entrypoints.cli import main

    out = tmp_path / "cli"
    with pytest.raises(SystemExit) as e:
        main(["env", "build-tasks", "feature-deletion", "--source", str(MINILIB), "--out", str(out), "--seed", "0",
              "--max-tasks", "1", "--jobs", "1"])
    res = capsys.readouterr()
    assert e.value.code == 0, res.err
    assert res.out.strip().splitlines()[-1] == str(out)
    assert "baseline run 1/2" in res.err and "accepted" in res.out  # progress on stderr, the summary on stdout
    assert without_timings(json.loads((out / "manifest.json").read_text())) == without_timings(small[0])
    assert tree_digest(out / "tasks") == tree_digest(small[1] / "tasks")
    # the last progress line: candidates checked of those that passed the filters (utils/progress.py)
    counted = re.findall(r"^\[composer-prime\] build-tasks: (\d+)/(\d+) candidates", res.err, re.M)
    r = small[0]["report"]
    assert counted[-1] == (str(r["evaluated"]), str(r["passed_filters"])) and r["evaluated"] < r["passed_filters"], res.err


def cli(argv: list[str], capsys) -> tuple[int, str]:
    from composer_prime.entrypoints.cli import main

    with pytest.raises(SystemExit) as e:
        main(["env", "build-tasks", "feature-deletion", *argv])
    return e.value.code, capsys.readouterr().err


TINY = "def f(x):\n    return x\n"


@pytest.mark.parametrize("case, message", [
    ("missing", "source not found"),
    ("not_python", "not a Python project"),
    ("no_tests", "no tests collected"),
    ("no_tasks", "no task accepted"),
    ("out_not_empty", "--out is not empty"),
    ("bad_pypi", "pypi source must pin one version"),
    ("out_in_source", "--out must not be inside the source tree"),
])
def test_cli_bad_input_is_one_line_exit_2(case, message, tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    if case == "not_python":
        write_tree(src, {"README.md": "hello\n"})
    if case == "no_tests":
        write_tree(src, {"pkg/__init__.py": TINY, "tests/test_pkg.py": "import pkg\n"})
    if case == "out_in_source":
        out = src / "tasks"
    if case in ("no_tasks", "out_not_empty", "out_in_source"):
        test = "from pkg import f\n\ndef test_f():\n    assert f(1) == 1\n"
        write_tree(src, {"pkg/__init__.py": TINY, "tests/test_pkg.py": test})
    if case == "out_not_empty":
        write_tree(out, {"keep.txt": "mine\n"})
    source = "pypi:inflection" if case == "bad_pypi" else str(src)
    code, err = cli(["--source", source, "--out", str(out)], capsys)
    # Progress lines may come first; the error is the last line, and the only one.
    lines = err.splitlines()
    assert code == 2 and lines[-1].startswith("error: ") and message in lines[-1], err
    assert sum(ln.startswith("error") for ln in lines) == 1 and "Traceback" not in err
    assert (out / "keep.txt").exists() if case == "out_not_empty" else not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_cli_bad_input_as_a_subprocess(tmp_path):
    res = subprocess.run(["uv", "run", "--no-sync", "composer-prime", "env", "build-tasks", "feature-deletion",
                          "--source", str(tmp_path / "nope"), "--out", str(tmp_path / "out")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr == f"error: source not found: {tmp_path / 'nope'}\n"


def test_interrupted_build_leaves_no_task_set(tmp_path):
    def log(msg: str) -> None:
        if msg.startswith("baseline run 1/2"):  # the staging directory and test environment exist by now
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build(str(MINILIB), tmp_path / "out", seed=0, log=log)
    assert [p.name for p in tmp_path.iterdir()] == ["out.build.log"]  # the log survives, nothing else


def test_refuses_a_test_environment_holding_the_project(tmp_path):
    # A project named `coverage`: the test environment's coverage would be imported instead of
    # the tree's copy, and an agent could read the pristine code from it.
    src = write_tree(tmp_path / "src", {"coverage/__init__.py": TINY, "tests/test_c.py": "def test_c():\n    pass\n"})
    with pytest.raises(BuildError, match="would hold the project's own module coverage .installed by coverage-"):
        build(str(src), tmp_path / "out", log=quiet)


def test_sandboxed_suite_reads_nodeids_and_outcomes(tmp_path):
    tree = write_tree(tmp_path / "t", {
        "tests/test_a.py": ("import pytest\n\nclass TestK:\n    def test_ok(self):\n        pass\n\n"
                            "@pytest.mark.parametrize('x', [1, 2])\ndef test_p(x):\n    assert x == 1\n\n"
                            "@pytest.mark.skip\ndef test_s():\n    pass\n"),
        "tests/sub/test_b.py": "import nothing_here\n",
    })
    suite = Suite(None, {}, [], ["tests"], Limits())
    res = suite.run(tree, ["tests"], tmp_path / "out", timeout_s=120)
    assert res == {"tests/test_a.py::TestK::test_ok": "passed", "tests/test_a.py::test_p[1]": "passed",
                   "tests/test_a.py::test_p[2]": "failed", "tests/test_a.py::test_s": "skipped",
                   "tests/sub/test_b.py": "error"}
    assert not list(tree.rglob("__pycache__")) and not (tree / ".pytest_cache").exists()


# ------------------------------------------------------------------ a real PyPI sdist
# inflection 0.5.1 from PyPI: its 3 candidates, all accepted, are the README's build, whose manifest and
# tasks tests/integration/test_readme_feature_deletion.py reads (this file built the same set again).

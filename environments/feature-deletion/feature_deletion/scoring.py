"""Score an agent's working copy: a fresh copy of the task, only its source changes, tests in a sandbox.

What the agent controls never decides how it is tested:
- the copy starts from the task's pristine `repo/` (tests, conftest.py, runner config all as shipped);
- of the agent's tree only `.py` files inside the task's own package cross over (or the task's
  file itself for a single-module project), never a test file, a conftest.py, a sitecustomize /
  usercustomize, a cache, a symlink, a `.pth`/`.pyc`/`.so`, or anything at the repo root
  (where it could shadow `pytest` or a stdlib module); everything else is reported as ignored;
- the suite runs in the sandbox (python -S, plugin autoload off, no cache provider) with the
  tests, conftest.py files and runner config mounted read-only (module code cannot rewrite a
  test file before it is collected) and the JUnit XML written to a directory outside the tree;
  outcomes come only from that XML;
- a canary test that must fail is added under a random name: if it passes or is missing, the
  run was tampered with (a patched pytest, a forged report) and the reward is 0.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feature_deletion import sandbox
from feature_deletion.baseline import CONFIG_FILES, STRIP_DIRS, copy_tree, is_test_file
from feature_deletion.pytest_run import parse_junit, pytest_command
from feature_deletion.taskdir import load_task

BLOCKED_NAMES = {"conftest.py", "sitecustomize.py", "usercustomize.py", "__main__.py"}
MAX_OVERLAY_BYTES = 1 << 20
MAX_OVERLAY_FILES = 20_000
MAX_COMPARE_BYTES = 16 << 20
MAX_JUNIT_BYTES = 64 << 20
SANDBOX_OUT = "/sandbox/out"


@dataclass(frozen=True)
class ScoreConfig:
    regressions_zero: bool = True  # any baseline-passing test failing now makes the reward 0
    timeout_s: float = 600.0
    limits: sandbox.Limits = sandbox.Limits()
    canary: bool = True
    freeze_tests: bool = True  # tests, conftest.py and runner config read-only during the run


@dataclass
class Score:
    reward: float
    passed: list[str]  # the task's tests that pass
    failed: list[str]  # the task's tests that do not (failed, errored, skipped or missing)
    regressions: list[str]  # other baseline-passing tests that no longer pass
    details: dict[str, Any] = field(default_factory=dict)


def copy_clean(src: Path, dst: Path) -> None:
    """Copy a tree without VCS data, bytecode, caches or build outputs, and without symlinks that
    point outside it (a careless generator's leftovers must not reach the agent or the scorer)."""
    copy_tree(Path(src), Path(dst))
    root = Path(dst).resolve()
    for top, dirs, files in os.walk(dst):
        for name in dirs + files:
            p = Path(top) / name
            if p.is_symlink() and not p.resolve().is_relative_to(root):
                p.unlink()


def _under(rel: str, prefixes: list[str]) -> bool:
    return any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in prefixes)


def source_roots(task: dict, pristine: Path) -> list[str]:
    """The package directories (or lone modules) whose files the agent may change."""
    roots = []
    for rel in {task["file"], *(d["file"] for d in task.get("deleted", []))}:
        d = Path(rel).parent
        if not (pristine / d / "__init__.py").is_file():
            roots.append(rel)  # a single module, or a namespace package: only the file itself
            continue
        while d.parent != Path(".") and (pristine / d.parent / "__init__.py").is_file():
            d = d.parent
        roots.append(d.as_posix())
    return sorted(set(roots))


def top_level_modules(roots: list[str]) -> list[str]:
    out = []
    for r in roots:
        parts = Path(r).parts
        parts = parts[1:] if parts[0] == "src" and len(parts) > 1 else parts
        out.append(Path(parts[0]).stem)
    return sorted(set(out))


def _same(a: Path, b: Path) -> bool:
    if a.is_symlink() or b.is_symlink():
        return a.is_symlink() and b.is_symlink() and os.readlink(a) == os.readlink(b)
    if not (a.is_file() and b.is_file()) or a.stat().st_size != b.stat().st_size:
        return False
    return a.stat().st_size <= MAX_COMPARE_BYTES and a.read_bytes() == b.read_bytes()


def _admissible(rel: str, path: Path, original: Path, dest: Path, roots: list[str], test_paths: list[str]) -> bool:
    parts = rel.split("/")
    return (
        not path.is_symlink() and path.is_file() and parts[-1].endswith(".py")
        and parts[-1] not in BLOCKED_NAMES and not is_test_file(parts[-1])
        and not any(p in STRIP_DIRS for p in parts) and not _under(rel, test_paths)
        and _under(rel, roots)
        and path.stat().st_size <= MAX_OVERLAY_BYTES
        and not original.is_symlink() and (dest / rel).parent.is_dir()
        # a new module only inside an existing regular package of the pristine tree
        and (original.is_file() or (original.parent / "__init__.py").is_file())
    )


def overlay(task: dict, pristine: Path, agent_repo: Path, dest: Path) -> tuple[list[str], list[str]]:
    """Copy the agent's admissible changes onto `dest` (a clean copy of `pristine`).
    Returns (applied, ignored) relative paths; files the agent left unchanged are neither, and
    files it deleted are ignored (`dest` keeps them)."""
    roots = source_roots(task, pristine)
    test_paths = list(task.get("test_paths", []))
    applied, ignored, seen = [], [], 0
    for top, dirs, files in os.walk(agent_repo):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if (Path(top) / d).is_symlink()]):
            seen += 1
            if seen > MAX_OVERLAY_FILES:
                ignored.append(f"... more than {MAX_OVERLAY_FILES} files: the rest not looked at")
                return applied, ignored
            path = Path(top) / name
            rel = path.relative_to(agent_repo).as_posix()
            if _same(path, pristine / rel):
                continue
            if _admissible(rel, path, pristine / rel, dest, roots, test_paths):
                shutil.copyfile(path, dest / rel)
                applied.append(rel)
            else:
                ignored.append(rel)
    return applied, ignored + _deleted(dest, agent_repo)


def _deleted(tree: Path, agent_repo: Path) -> list[str]:
    """Files of `tree` (the pristine copy) that the agent's tree no longer has."""
    out = []
    for top, dirs, files in os.walk(tree):
        dirs.sort()
        for name in sorted(files):
            rel = (Path(top) / name).relative_to(tree).as_posix()
            if not os.path.lexists(agent_repo / rel):
                out.append(rel)
    return out


def junit_outcomes(junit: Path, tree: Path) -> tuple[dict[str, str], str | None]:
    """{nodeid: outcome} from the XML, or ({}, why) when there is no trustworthy report."""
    if junit.is_symlink() or (junit.exists() and not junit.is_file()):
        return {}, "JUnit report is not a regular file"  # made by the code under test: never follow
    if not junit.is_file():
        return {}, "no JUnit report"
    if junit.stat().st_size > MAX_JUNIT_BYTES:
        return {}, "JUnit report too large"
    data = junit.read_bytes()  # read once: what is checked is what is parsed
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:  # no entity expansion from an untrusted file
        return {}, "JUnit report has a DOCTYPE"
    try:
        return parse_junit(data, tree), None
    except Exception as e:  # noqa: BLE001 - any unparsable report scores as no report
        return {}, f"unreadable JUnit report: {e}"


def _write_canary(task: dict, repo: Path) -> str:
    """A test that must fail, beside the task's tests, under a name nothing can predict."""
    first = (task["tests"] or task["baseline_passing"])[0].split("::")[0]
    name = f"test_{secrets.token_hex(6)}"
    rel = (Path(first).parent / f"{name}.py").as_posix()
    (repo / rel).write_text(f"def {name}():\n    assert 1 + 1 == 3, 'canary'\n")
    return f"{rel}::{name}"


OPTIONS_WITH_VALUE = {"-o", "-p", "-c", "-W", "--rootdir", "--confcutdir", "--import-mode"}


def split_pytest_args(args: list[str]) -> tuple[list[str], list[str]]:
    """A task's pytest_args as (options with their values, test targets)."""
    options, targets, i = [], [], 0
    while i < len(args):
        if args[i] in OPTIONS_WITH_VALUE and i + 1 < len(args):
            options += args[i : i + 2]
            i += 2
            continue
        (options if args[i].startswith("-") else targets).append(args[i])
        i += 1
    return options, targets


def protected_paths(task: dict, repo: Path, canary: str | None) -> list[str]:
    """What the code under test must not rewrite while the suite runs (tests it has not been
    collected yet, conftest.py files, runner config): mounted read-only over the writable copy."""
    paths = {p for p in task.get("test_paths", []) if (repo / p).exists() and ".." not in Path(p).parts}
    paths |= {c for c in CONFIG_FILES if (repo / c).is_file()}
    paths |= {p.relative_to(repo).as_posix() for p in repo.rglob("conftest.py") if p.is_file() and not p.is_symlink()}
    if canary:
        paths.add(canary.split("::")[0])
    # a path inside another protected directory is covered by that directory's mount
    return sorted(p for p in paths if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in paths))


def suite_env(task_dir: Path, task: dict) -> tuple[Path | None, dict]:
    """The task's test environment (None for a set built without one: this venv's allow-list is
    mounted then) and the environment variables its pytest runs need."""
    site = (Path(task_dir) / task["testenv"]).resolve() if task.get("testenv") else None
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": None} if task.get("pytest_autoload") else {}
    return site, env


def sandboxed_pytest(repo: Path, out: Path, args: list[str], junit_name: str, timeout_s: float,
                     limits: sandbox.Limits, hidden: list[str], mounts: list[sandbox.Mount] | None = None,
                     *, site: Path | None = None, env: dict | None = None):
    """Run pytest on `repo` in the sandbox, its JUnit report written to `out` (mounted read-write
    outside the tree); returns (outcomes per test id, report problem or None, the run's Result).
    The one way the generator, scoring and the agent's `run_tests` tool run a suite."""
    cmd = pytest_command(Path(sandbox.SANDBOX_REPO), args, Path(SANDBOX_OUT) / junit_name,
                         basetemp=Path("/tmp/pytest-basetemp"))
    result = sandbox.run(sandbox.python_argv(*cmd[1:], safe_path=False), repo, timeout_s, limits,
                         mounts=[sandbox.Mount(out, SANDBOX_OUT, writable=True), *(mounts or [])], hidden_modules=hidden,
                         site=site, env=env)
    outcomes, problem = junit_outcomes(out / junit_name, repo)
    return outcomes, problem, result


def task_test_args(task: dict, tests: list[str]) -> list[str]:
    """What `run_tests` runs: the task's pytest options and the given tests, nothing of the rest."""
    return [*split_pytest_args(task.get("pytest_args", []))[0], "--tb=short", *tests]


def score_task(task_dir: Path, agent_repo: Path, config: ScoreConfig = ScoreConfig()) -> Score:
    task_dir, agent_repo = Path(task_dir), Path(agent_repo)
    task = load_task(task_dir)
    pristine = task_dir / "repo"
    work = Path(tempfile.mkdtemp(prefix="fd-score-"))
    try:
        repo, out = work / "repo", work / "out"
        copy_clean(pristine, repo)
        out.mkdir()
        applied, ignored = overlay(task, pristine, agent_repo, repo)
        canary = _write_canary(task, repo) if config.canary else None
        targets = []
        if not split_pytest_args(task.get("pytest_args", []))[1]:  # an explicit file would narrow the run to it
            targets = sorted({t.split("::")[0] for t in [*task["tests"], *task.get("baseline_passing", [])]})
        if canary:  # named explicitly: collected whatever the project's python_files pattern
            targets.append(canary.split("::")[0])
        frozen = [sandbox.Mount(repo / rel, f"{sandbox.SANDBOX_REPO}/{rel}")
                  for rel in (protected_paths(task, repo, canary) if config.freeze_tests else [])]
        site, env = suite_env(task_dir, task)
        outcomes, problem, result = sandboxed_pytest(
            repo, out, [*task.get("pytest_args", []), *targets], f"junit-{secrets.token_hex(8)}.xml",
            config.timeout_s, config.limits, top_level_modules(source_roots(task, pristine)), frozen, site=site, env=env)
        return _score(task, config, outcomes, problem, canary, result, applied, ignored)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _score(task, config, outcomes, problem, canary, result, applied, ignored) -> Score:
    tests = list(task["tests"])
    passed = [t for t in tests if outcomes.get(t) == "passed"]
    failed = [t for t in tests if outcomes.get(t) != "passed"]
    task_set = set(tests)
    regressions = [t for t in task.get("baseline_passing", []) if t not in task_set and outcomes.get(t) != "passed"]
    tampered = None
    if canary and not problem:
        seen = outcomes.get(canary)
        if seen != "failed":
            tampered = f"canary test {canary} was {seen or 'missing'} (must fail)"
    reward = len(passed) / len(tests) if tests else 0.0
    if problem or tampered or (regressions and config.regressions_zero):
        reward = 0.0
    details = {
        "applied": applied, "ignored": ignored, "report_problem": problem, "tampered": tampered,
        "returncode": result.returncode, "timed_out": result.timed_out, "killed": result.killed,
        "duration_s": round(result.duration_s, 3), "raw_fraction": len(passed) / len(tests) if tests else 0.0,
        "outcomes": {t: outcomes.get(t, "missing") for t in tests},
        "output": re.sub(r"\s+\Z", "", result.stdout + result.stderr),
    }
    return Score(reward=reward, passed=passed, failed=failed, regressions=regressions, details=details)

"""Build a Feature Deletion task set from a Python source tree with a pytest suite.

    source (dir | sdist | pypi:name==ver) -> unpack and strip -> its test environment (uv)
    -> baseline (suite run twice) -> coverage run (one context per test) -> functions sized 5-80
    body lines, covered by 3..20% of the suite -> seeded order -> the gates -> tasks + manifest.

Every run of the suite happens in the scoring sandbox with the source's test environment
(suite.py), and the gates score each candidate with the scorer itself (gates.py). See
docs/environments.md "Feature Deletion: building tasks" for the on-disk format.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from feature_deletion import sandbox, taskdir
from feature_deletion.baseline import (Baseline, BuildError, Layout, check_source, classify, copy_tree, fetch_pypi,
                                       find_layout, unpack)
from feature_deletion.buildlog import BuildLog, Counted, log_path, stderr, uncounted
from feature_deletion.candidates import EXAMPLES, VARIANTS, Candidate, Settings, select
from feature_deletion.gates import Gates, GateResult
from feature_deletion.pytest_run import PytestError, neutral_options
from feature_deletion.suite import Suite
from feature_deletion.testenv import build_env

TESTENV = "testenv"  # <set>/testenv/site is the test environment; task.json points at it relatively


def resolve_source(source: str, out: Path, log: Callable[[str], None]) -> tuple[Path, str]:
    """-> (local path, origin as recorded in the manifest)."""
    if source.startswith("pypi:"):
        return fetch_pypi(source[5:], log), source
    check_source(source)
    path = Path(source).expanduser()
    if out.is_relative_to(path.resolve()):
        raise BuildError(f"--out must not be inside the source tree: {out}")
    return path.resolve(), (str(path.resolve()) if path.is_dir() else path.name)


@dataclass
class Recorded:
    base: Baseline
    lines: dict[Path, dict[int, set[str]]]   # pristine file -> line -> nodeids
    seconds: list[float]                     # the two baseline runs
    coverage_s: float


def record(pristine: Path, layout: Layout, args: list[str], suite: Suite, work: Path, s: Settings,
           log: BuildLog) -> Recorded:
    """Two baseline runs and a coverage run, all on one copy of the tree (never on `pristine`)."""
    run = work / "run"
    copy_tree(pristine, run)
    runs, times = [], []
    try:
        for i in (1, 2):
            t = time.perf_counter()
            runs.append(suite.run(run, args, work / f"baseline{i}", s.baseline_timeout_s, keep_output=i == 1))
            times.append(time.perf_counter() - t)
            log(f"baseline run {i}/2: {len(runs[-1])} tests, {Counter(runs[-1].values()).get('passed', 0)} "
                f"passed, {times[-1]:.1f} s")
            if not runs[-1]:
                raise BuildError("no tests collected")
        t = time.perf_counter()
        include = [run / p.relative_to(pristine) for p in layout.include]
        outcomes, lines = suite.coverage(run, args, include, work / "cov", s.baseline_timeout_s)
    except PytestError as e:
        raise BuildError(f"the test suite does not run: {e}") from None
    t_cov = time.perf_counter() - t
    # The coverage run counts as a third baseline run: a test that only passes untraced is not stable.
    base = classify([*runs, outcomes])
    broken_modules = [t for t in base.failing if "::" not in t]
    if broken_modules:
        log(f"{len(broken_modules)} test modules do not import (a missing dependency? see --deps): "
            f"{', '.join(broken_modules[:5])}")
    log(f"coverage run: {t_cov:.1f} s; {len(base.stable_passing)} stable passing, {len(base.unstable)} "
        f"unstable, {len(base.failing)} failing")
    if not base.stable_passing:
        raise BuildError("no test passes reliably")
    lines = {pristine / p.relative_to(run): v for p, v in lines.items() if p.is_relative_to(run)}
    return Recorded(base, lines, times, t_cov)


def run_gates(order: list[Candidate], gates: Gates, max_tasks: int | None, jobs: int,
              accept: Callable[[int, Candidate, dict[str, str], GateResult], None],
              reject: Callable[[int, Candidate, GateResult], None]) -> int:
    """Check candidates in order until `max_tasks` are accepted; returns how many were checked.
    They are checked `jobs` at a time but taken in order, so the result does not depend on
    `jobs` (checks past the last task needed are thrown away)."""
    jobs, accepted, evaluated = max(1, jobs), 0, 0

    def check(slot: int, cand: Candidate, broken: dict[str, str]) -> GateResult:
        return gates.check(broken, cand.tests, slot=str(slot))

    with ThreadPoolExecutor(jobs) as pool:
        for start in range(0, len(order), jobs):
            window = order[start:start + jobs]
            # Sources are cut here, not in the pool: CPython 3.11 keeps the AST builder's
            # recursion depth in process-wide state, so two threads in ast.parse at once can
            # fail with "AST constructor recursion depth mismatch".
            cut = [cand.broken(gates.pristine) for cand in window]
            results = pool.map(check, range(len(window)), window, cut)
            for cand, broken, res in zip(window, cut, results):
                if max_tasks is not None and accepted >= max_tasks:
                    return evaluated
                evaluated += 1
                if res.accepted:
                    accepted += 1
                    accept(evaluated, cand, broken, res)
                else:
                    reject(evaluated, cand, res)
            if max_tasks is not None and accepted >= max_tasks:
                break
    return evaluated


def build(source: str, out: Path, seed: int = 0, max_tasks: int | None = None, variant: str = "body",
          force: bool = False, jobs: int = 1, settings: Settings | None = None,
          log: Callable[[str], None] = stderr, log_file: Path | None = None, progress: Counted = uncounted) -> dict:
    """Build the task set into `out`; returns the manifest. Raises BuildError on bad input. The
    build log goes to `log_file` (default `<out>.build.log`), which outlives a failed build;
    `progress` is told (candidates checked, candidates) as the gates go."""
    s = settings or Settings()
    if variant not in VARIANTS:
        raise BuildError(f"unknown variant {variant!r} (one of {', '.join(VARIANTS)})")
    out = Path(out).resolve()
    taskdir.check_out(out, force)
    blog = BuildLog(log_file or log_path(out), log)
    work, stage = Path(tempfile.mkdtemp(prefix="fd-build-")), None
    try:
        stage = taskdir.staging(out)
        return _build(source, out, seed, max_tasks, variant, force, jobs, s, blog, work, stage, progress)
    except BuildError as e:
        blog(f"error: {e}", echo=False)  # the caller reports it, once
        raise BuildError(f"{e}{blog.where()}") from None
    finally:
        blog.close()
        shutil.rmtree(work, ignore_errors=True)
        if stage is not None and stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def _build(source: str, out: Path, seed: int, max_tasks: int | None, variant: str, force: bool, jobs: int,
           s: Settings, log: BuildLog, work: Path, stage: Path, progress: Counted) -> dict:
    t0 = time.perf_counter()
    try:
        sandbox.ensure_available()
    except sandbox.SandboxUnavailable as e:
        raise BuildError(str(e)) from None
    path, origin = resolve_source(source, out, log)
    pristine = work / "pristine"
    kind, digest, declared = unpack(path, pristine)
    layout = find_layout(pristine)
    if not layout.source_files:
        raise BuildError(f"not a Python project: no top-level package or module in {source}")
    if not layout.test_targets:
        raise BuildError(f"no test files (test_*.py, *_test.py, tests/) in {source}")
    log(f"{len(layout.source_files)} source files ({', '.join(layout.modules)}); declared requirements "
        f"{declared.requirements() or 'none'} (from {', '.join(declared.origins) or 'nowhere'})")
    t = time.perf_counter()
    env = build_env(stage / TESTENV, declared, s.deps, layout.modules, s.declared_deps, log, log.detail)
    t_env = time.perf_counter() - t
    plugins = env.loaded_plugins() if s.pytest_plugins is None else s.pytest_plugins
    args = [*([] if s.keep_pytest_config else neutral_options(plugins)), *layout.pytest_opts, *layout.test_targets]
    env_vars = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": None} if s.keep_pytest_config else {}
    log(f"test environment: {len(env.installed)} distributions in {t_env:.1f} s; pytest {' '.join(args)}")
    limits = sandbox.Limits(cpu_s=int(s.baseline_timeout_s))
    suite = Suite(env.site, env_vars, layout.modules, layout.test_paths, limits, log.detail)
    try:
        rec = record(pristine, layout, args, suite, work, s, log)
    except BuildError as e:
        raise BuildError(f"{e} in {source}") from None
    base = rec.base
    sel = select(pristine, layout, base.stable_passing, base.unstable, rec.lines, variant, s)
    order = sorted(sel.candidates, key=lambda c: (c.file, c.fn.lineno))
    random.Random(seed).shuffle(order)
    log(f"{sel.functions} functions, {len(order)} pass the size and test filters")
    for reason, names in sorted(sel.rejected.items()):  # every one named, in the log
        log.detail(f"rejected, {reason}: {', '.join(sorted(names))}")

    common = {"baseline_passing": base.stable_passing, "test_paths": layout.test_paths, "pytest_args": args,
              "testenv": f"../../{TESTENV}/site", "pytest_autoload": s.keep_pytest_config}
    gates = Gates(pristine, work / "gates", {**common, "testenv": str(env.site)}, suite,
                  timeout_s=max(60.0, 10 * max(rec.seconds)), min_tests=s.min_tests)
    tasks: list[dict] = []
    gate_rejections: list[dict] = []

    def accept(i: int, cand: Candidate, broken: dict[str, str], res: GateResult) -> None:
        task = {"id": cand.task_id(variant), "file": cand.file, "qualname": cand.fn.qualname,
                "deleted": cand.deleted(), "tests": res.tests, **common,
                "body_lines": cand.body_lines, "n_tests": len(res.tests), "variant": variant, "checked": res.checked}
        taskdir.write_task(stage, task, pristine, broken)
        tasks.append(task)
        log(f"[{i}/{len(order)}] {cand.name}: accepted, {len(res.tests)} tests "
            f"({len(tasks)}{f'/{max_tasks}' if max_tasks else ''})")
        progress(i, len(order))

    def reject(i: int, cand: Candidate, res: GateResult) -> None:
        sel.reject(res.reason, cand.name)
        gate_rejections.append({"function": cand.name, "reason": res.reason, "detail": res.detail})
        log(f"[{i}/{len(order)}] {cand.name}: rejected, {res.reason} ({res.detail})")
        if res.output:
            log.detail(res.output)
        progress(i, len(order))

    t = time.perf_counter()
    progress(0, len(order))
    evaluated = run_gates(order, gates, max_tasks, jobs, accept, reject)
    t_gates = time.perf_counter() - t
    report = {
        "tests_collected": len(base.collected), "tests_stable_passing": len(base.stable_passing),
        "unstable": base.unstable, "baseline_failing": base.failing, "tests_skipped": len(base.skipped),
        "candidates": sel.functions, "accepted": len(tasks),
        "rejected": {r: len(v) for r, v in sorted(sel.rejected.items())},
        "rejected_examples": {r: sorted(v)[:EXAMPLES] for r, v in sorted(sel.rejected.items())},
        "gate_rejections": gate_rejections,
        "passed_filters": len(order), "evaluated": evaluated, "not_evaluated": len(order) - evaluated,
        "seconds": {"testenv": round(t_env, 3), "baseline": round(sum(rec.seconds), 3),
                    "coverage": round(rec.coverage_s, 3), "gates": round(t_gates, 3),
                    "total": round(time.perf_counter() - t0, 3)},
    }
    if not tasks:
        raise BuildError(f"no task accepted from {source}: {len(order)} candidates passed the filters, "
                         f"rejected {report['rejected']}")
    settings_out = {k: v for k, v in vars(s).items() if k != "baseline_timeout_s"}
    manifest = {"format": 1, "env": "feature-deletion", "seed": seed, "variant": variant,
                "source": {"kind": kind, "origin": origin, "sha256": digest},
                "settings": {**settings_out, "max_tasks": max_tasks}, "testenv": env.record(),
                "report": report, "tasks": tasks}
    taskdir.finish(stage, out, manifest, force)
    return manifest

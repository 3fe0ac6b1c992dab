"""Build a Feature Deletion task set from a Python source tree with a pytest suite.

    source (dir | sdist | pypi:name==ver) -> unpack and strip -> baseline (suite run twice)
    -> coverage run (one context per test) -> functions sized 5-80 body lines, covered by
    3..20% of the suite -> seeded order -> the four gates -> tasks on disk + manifest.

See docs/environments.md "Feature Deletion: building tasks" for the on-disk format.
"""

from __future__ import annotations

import ast
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from feature_deletion import taskdir
from feature_deletion.baseline import (Baseline, BuildError, Layout, classify, copy_tree, fetch_pypi, find_layout,
                                       installed_modules, unpack)
from feature_deletion.coverage_map import run_with_contexts
from feature_deletion.deletion import Function, apply_deletions, find_functions, private_helpers, references
from feature_deletion.gates import Gates, GateResult
from feature_deletion.pytest_run import PytestError, run_pytest

VARIANTS = ("body", "with_helpers")
# Static rejections, checked in this order; gate rejections come from feature_deletion.gates.
NO_HELPERS, TOO_SHORT, TOO_LONG = "no_private_helpers", "too_short", "too_long"
UNSTABLE, TOO_FEW, TOO_MANY = "unstable_tests", "too_few_tests", "too_many_tests"
DUPLICATE = "duplicate_name"  # two definitions share a qualname (property setters, overloads)
EXAMPLES = 10  # rejected_examples kept per reason


@dataclass
class Settings:
    min_body_lines: int = 5
    max_body_lines: int = 80
    min_tests: int = 3
    max_test_fraction: float = 0.2
    baseline_timeout_s: float = 1800.0


@dataclass
class Candidate:
    file: str                      # relative to the repo root
    module: str
    fn: Function
    helpers: list[Function]
    tests: list[str]               # stable-passing tests that execute its body (or its helpers')

    @property
    def name(self) -> str:
        return f"{self.module}.{self.fn.qualname}"

    def task_id(self, variant: str) -> str:
        return f"{self.module}--{self.fn.qualname}--{variant}"

    @property
    def body_lines(self) -> int:
        return sum(f.body_lines for f in (self.fn, *self.helpers))

    def deleted(self) -> list[dict]:
        return [{"file": self.file, "qualname": f.qualname, "lineno": f.lineno, "end_lineno": f.end_lineno,
                 "kind": kind} for f, kind in [(self.fn, "body"), *((h, "removed") for h in self.helpers)]]

    def broken(self, tree: Path) -> dict[str, str]:
        source = (tree / self.file).read_bytes().decode("utf-8")
        edits = [(self.fn, "body"), *((h, "remove") for h in self.helpers)]
        return {self.file: apply_deletions(source, edits)}


@dataclass
class Selection:
    functions: int = 0
    candidates: list[Candidate] = field(default_factory=list)
    rejected: dict[str, list[str]] = field(default_factory=dict)   # reason -> [module.qualname]

    def reject(self, reason: str, name: str) -> None:
        self.rejected.setdefault(reason, []).append(name)


def module_name(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    if parts[0] == "src":
        parts = parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def select(tree: Path, layout: Layout, stable: list[str], unstable: list[str],
           lines: dict[Path, dict[int, set[str]]], variant: str, s: Settings) -> Selection:
    """Every function of the source files, either a candidate for the gates or rejected statically."""
    sources: dict[str, str] = {}
    for rel in layout.source_files:
        try:
            sources[rel] = (tree / rel).read_bytes().decode("utf-8")
            ast.parse(sources[rel])
        except (UnicodeDecodeError, SyntaxError, ValueError):
            sources.pop(rel, None)  # not parseable by this interpreter: not a source of tasks
    refs = {rel: references(text) for rel, text in sources.items()}
    stable_set, unstable_set = set(stable), set(unstable)
    max_tests = max(s.min_tests, int(s.max_test_fraction * len(stable)))
    sel = Selection()
    for rel, text in sources.items():
        fns = find_functions(text)
        cov = lines.get((tree / rel).resolve(), {})
        seen = Counter(f.qualname for f in fns)
        for fn in fns:
            sel.functions += 1
            if seen[fn.qualname] > 1:
                sel.reject(DUPLICATE, f"{module_name(rel)}.{fn.qualname}")
                continue
            helpers = private_helpers(fn, fns, rel, refs) if variant == "with_helpers" else []
            cand = Candidate(rel, module_name(rel), fn, helpers, [])
            covering = {t for f in (fn, *helpers) for ln in range(f.body_start, f.end_lineno + 1)
                        for t in cov.get(ln, ())}
            cand.tests = sorted(covering & stable_set)
            reason = (NO_HELPERS if variant == "with_helpers" and not helpers
                      else TOO_SHORT if cand.body_lines < s.min_body_lines
                      else TOO_LONG if cand.body_lines > s.max_body_lines
                      else UNSTABLE if covering & unstable_set
                      else TOO_FEW if len(cand.tests) < s.min_tests
                      else TOO_MANY if len(cand.tests) > max_tests else None)
            if reason:
                sel.reject(reason, cand.name)
            else:
                sel.candidates.append(cand)
    return sel


def resolve_source(source: str, out: Path, log: Callable[[str], None]) -> tuple[Path, str]:
    """-> (local path, origin as recorded in the manifest)."""
    if source.startswith("pypi:"):
        return fetch_pypi(source[5:], log), source
    path = Path(source).expanduser()
    if not path.exists():
        raise BuildError(f"source not found: {source}")
    if out.is_relative_to(path.resolve()):
        raise BuildError(f"--out must not be inside the source tree: {out}")
    return path.resolve(), (str(path.resolve()) if path.is_dir() else path.name)


@dataclass
class Recorded:
    base: Baseline
    lines: dict[Path, dict[int, set[str]]]   # pristine file -> line -> nodeids
    seconds: list[float]                     # the two baseline runs
    coverage_s: float


def record(pristine: Path, layout: Layout, work: Path, s: Settings, log: Callable[[str], None]) -> Recorded:
    """Two baseline runs and a coverage run, all on one copy of the tree (never on `pristine`)."""
    run = work / "run"
    copy_tree(pristine, run)
    runs, times = [], []
    try:
        for i in (1, 2):
            t = time.perf_counter()
            runs.append(run_pytest(run, layout.pytest_args, work / f"baseline{i}.xml", s.baseline_timeout_s,
                                   basetemp=work / "basetemp"))
            times.append(time.perf_counter() - t)
            log(f"baseline run {i}/2: {len(runs[-1])} tests, {Counter(runs[-1].values()).get('passed', 0)} "
                f"passed, {times[-1]:.1f} s")
            if not runs[-1]:
                raise BuildError("no tests collected")
        t = time.perf_counter()
        include = [run / p.relative_to(pristine) for p in layout.include]
        outcomes, lines = run_with_contexts(run, layout.pytest_args, include, work / "cov", s.baseline_timeout_s)
    except PytestError as e:
        raise BuildError(f"the test suite does not run: {str(e).splitlines()[0]}") from None
    t_cov = time.perf_counter() - t
    # The coverage run counts as a third baseline run: a test that only passes untraced is not stable.
    base = classify([*runs, outcomes])
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
          log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> dict:
    """Build the task set into `out`; returns the manifest. Raises BuildError on bad input."""
    s = settings or Settings()
    if variant not in VARIANTS:
        raise BuildError(f"unknown variant {variant!r} (one of {', '.join(VARIANTS)})")
    out = Path(out).resolve()
    taskdir.check_out(out, force)
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="fd-build-"))
    stage = None
    try:
        path, origin = resolve_source(source, out, log)
        pristine = work / "pristine"
        kind, digest = unpack(path, pristine)
        layout = find_layout(pristine)
        if not layout.source_files:
            raise BuildError(f"not a Python project: no top-level package or module in {source}")
        if not layout.test_targets:
            raise BuildError(f"no test files (test_*.py, *_test.py, tests/) in {source}")
        clash = installed_modules(layout.modules)
        if clash:
            raise BuildError(f"{', '.join(clash)} is installed in this interpreter ({sys.executable}): its tests "
                             "would import that copy, and an agent could read the pristine code from it")
        log(f"{len(layout.source_files)} source files ({', '.join(layout.modules)}); "
            f"pytest {' '.join(layout.pytest_args)}")
        try:
            rec = record(pristine, layout, work, s, log)
        except BuildError as e:
            raise BuildError(f"{e} in {source}") from None
        base = rec.base
        sel = select(pristine, layout, base.stable_passing, base.unstable, rec.lines, variant, s)
        order = sorted(sel.candidates, key=lambda c: (c.file, c.fn.lineno))
        random.Random(seed).shuffle(order)
        log(f"{sel.functions} functions, {len(order)} pass the size and test filters")

        gates = Gates(pristine, work / "gates", layout.pytest_opts, layout.test_targets, base.stable_passing,
                      timeout_s=max(60.0, 10 * max(rec.seconds)), min_tests=s.min_tests)
        stage = taskdir.staging(out)
        tasks: list[dict] = []

        def accept(i: int, cand: Candidate, broken: dict[str, str], res: GateResult) -> None:
            task = {"id": cand.task_id(variant), "file": cand.file, "qualname": cand.fn.qualname,
                    "deleted": cand.deleted(), "tests": res.tests, "baseline_passing": base.stable_passing,
                    "test_paths": layout.test_paths, "pytest_args": layout.pytest_args,
                    "body_lines": cand.body_lines, "n_tests": len(res.tests), "variant": variant}
            taskdir.write_task(stage, task, pristine, broken)
            tasks.append(task)
            log(f"[{i}/{len(order)}] {cand.name}: accepted, {len(res.tests)} tests "
                f"({len(tasks)}{f'/{max_tasks}' if max_tasks else ''})")

        def reject(i: int, cand: Candidate, res: GateResult) -> None:
            sel.reject(res.reason, cand.name)
            log(f"[{i}/{len(order)}] {cand.name}: rejected, {res.reason} ({res.detail})")

        t = time.perf_counter()
        evaluated = run_gates(order, gates, max_tasks, jobs, accept, reject)
        t_gates = time.perf_counter() - t
        report = {
            "tests_collected": len(base.collected), "tests_stable_passing": len(base.stable_passing),
            "unstable": base.unstable, "baseline_failing": base.failing, "tests_skipped": len(base.skipped),
            "candidates": sel.functions, "accepted": len(tasks),
            "rejected": {r: len(v) for r, v in sorted(sel.rejected.items())},
            "rejected_examples": {r: sorted(v)[:EXAMPLES] for r, v in sorted(sel.rejected.items())},
            "passed_filters": len(order), "evaluated": evaluated, "not_evaluated": len(order) - evaluated,
            "seconds": {"baseline": round(sum(rec.seconds), 3), "coverage": round(rec.coverage_s, 3),
                        "gates": round(t_gates, 3), "total": round(time.perf_counter() - t0, 3)},
        }
        if not tasks:
            raise BuildError(f"no task accepted from {source}: {len(order)} candidates passed the filters, "
                             f"rejected {report['rejected']}")
        settings_out = {k: v for k, v in vars(s).items() if k != "baseline_timeout_s"}
        manifest = {"format": 1, "env": "feature-deletion", "seed": seed, "variant": variant,
                    "source": {"kind": kind, "origin": origin, "sha256": digest},
                    "settings": {**settings_out, "max_tasks": max_tasks}, "report": report, "tasks": tasks}
        taskdir.finish(stage, out, manifest, force)
        stage = None
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)

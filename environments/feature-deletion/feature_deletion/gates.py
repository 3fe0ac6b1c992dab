"""The acceptance gates for a candidate deletion, checked with the scorer's own code path.

  (b) the candidate's tests fail once the feature is deleted: `score_task` on the broken repo,
      run exactly as scoring runs it (whole suite, tests read-only, canary, JUnit XML, the
      source's test environment); the tests that fail there (at least `min_tests`) become the
      task's tests;
  (c) every other baseline-passing test still passes in that same run;
  (d) the restored function scores exactly 1.0: `score_task` with the original file as the
      agent's change;
  (a) the task's tests pass on their own, as the agent's `run_tests` runs them, in a working
      copy where they have failed once and the function was then restored (what an agent's
      session goes through). When they do not, a run on a fresh pristine copy tells "they fail
      on their own" (a) from "the failed run left state behind" (d).

The broken repo scores 0 by construction (the task's tests are those that failed in it) and the
restored one 1.0 by (d): both are recorded in the task as `checked`. Per candidate: two
full-suite runs and two or three runs of the task's tests, all sandboxed.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from feature_deletion.scoring import ScoreConfig, copy_clean, sandboxed_pytest, score_task, task_test_args
from feature_deletion.suite import Suite
from feature_deletion.taskdir import TASK_FILE

FAILS_BEFORE = "fails_before"                      # gate (a)
NOT_FAILING = "not_failing_after_deletion"         # gate (b)
COLLATERAL = "collateral_failures"                 # gate (c)
RESTORE_FAILS = "restore_fails"                    # gate (d)
TIMEOUT = "timeout"
PYTEST_ERROR = "pytest_error"


@dataclass
class GateResult:
    reason: str | None                  # None: accepted
    tests: list[str] = field(default_factory=list)   # the tests that fail after deletion
    detail: str = ""
    output: str = ""                    # pytest's output of the run that decided, for the build log
    checked: dict = field(default_factory=dict)      # the scores seen: {"broken": 0.0, "restored": 1.0}

    @property
    def accepted(self) -> bool:
        return self.reason is None


def _e_g(items: list[str]) -> str:
    return f"{len(items)}, e.g. {items[0]}" if items else "0"


@dataclass
class Gates:
    pristine: Path                 # never run: every check starts from a fresh copy of it
    work: Path                     # scratch space outside the tree
    common: dict                   # task fields shared by the source's tasks (baseline_passing, pytest_args, ...)
    suite: Suite                   # the sandbox settings of every run
    timeout_s: float
    min_tests: int = 3

    def check(self, broken: dict[str, str], tests: list[str], slot: str = "0") -> GateResult:
        """`broken`: {relative path: new text}; `tests`: the covering, stable-passing tests.
        Checks running at the same time need different `slot`s (their scratch directories)."""
        d = self.work / slot
        shutil.rmtree(d, ignore_errors=True)
        tdir = d / "task"
        copy_clean(self.pristine, tdir / "repo")
        for rel, text in broken.items():
            (tdir / "repo" / rel).write_bytes(text.encode("utf-8"))
        try:
            return self._check(tdir, broken, tests, d)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def _task(self, tdir: Path, rel: str, tests: list[str]) -> dict:
        task = {**self.common, "id": "candidate", "file": rel, "tests": tests}
        (tdir / TASK_FILE).write_text(json.dumps(task))
        return task

    def _check(self, tdir: Path, broken: dict[str, str], tests: list[str], d: Path) -> GateResult:
        config = ScoreConfig(timeout_s=self.timeout_s, limits=self.suite.limits)
        self._task(tdir, next(iter(broken)), tests)
        after = score_task(tdir, tdir / "repo", config)
        out = after.details
        if out["timed_out"]:
            return GateResult(TIMEOUT, detail=f"the broken repo's scoring ran past {self.timeout_s:.0f} s",
                              output=out["output"])
        if out["report_problem"] or out["tampered"]:
            return GateResult(PYTEST_ERROR, detail=f"scoring the broken repo: {out['report_problem'] or out['tampered']}",
                              output=out["output"])
        failing = after.failed
        if len(failing) < self.min_tests:
            return GateResult(NOT_FAILING, failing, f"{len(failing)}/{len(tests)} tests fail after deletion")
        if after.regressions:
            return GateResult(COLLATERAL, failing, f"other tests fail: {_e_g(after.regressions)}", out["output"])
        task = self._task(tdir, next(iter(broken)), failing)
        restored = score_task(tdir, self.pristine, config)
        if restored.reward != 1.0:
            r = restored.details
            why = (r["report_problem"] or r["tampered"] or (f"{len(restored.failed)} tests still fail, e.g. "
                   f"{restored.failed[0]}" if restored.failed else f"regressions: {_e_g(restored.regressions)}"))
            return GateResult(RESTORE_FAILS, failing, f"the restored function scores {restored.reward:.3f}: {why}",
                              r["output"])
        return self._session(tdir, task, broken, failing, d)

    def _tests(self, repo: Path, task: dict, tests: list[str], out: Path) -> tuple[list[str], str]:
        """Run `tests` as the agent's run_tests does; -> (those not passing, output)."""
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        outcomes, _, res = sandboxed_pytest(repo, out, task_test_args(task, tests), "junit.xml", self.timeout_s,
                                            self.suite.limits, self.suite.hidden, site=self.suite.site, env=self.suite.env)
        return [t for t in tests if outcomes.get(t) != "passed"], res.stdout + res.stderr

    def _session(self, tdir: Path, task: dict, broken: dict[str, str], failing: list[str], d: Path) -> GateResult:
        session = d / "session"
        copy_clean(tdir / "repo", session)
        self._tests(session, task, failing, d / "out")  # they fail here; whatever the run leaves stays
        for rel in broken:
            shutil.copyfile(self.pristine / rel, session / rel)
        bad, output = self._tests(session, task, failing, d / "out")
        if not bad:
            return GateResult(None, failing, checked={"broken": 0.0, "restored": 1.0})
        alone = d / "alone"
        copy_clean(self.pristine, alone)
        bad_alone, output_alone = self._tests(alone, task, failing, d / "out")
        if bad_alone:
            return GateResult(FAILS_BEFORE, failing, f"tests fail when run on their own: {_e_g(bad_alone)}", output_alone)
        return GateResult(RESTORE_FAILS, failing, f"tests still fail after a failed run and a restore: {_e_g(bad)}", output)

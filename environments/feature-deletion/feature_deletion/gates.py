"""The four acceptance gates for a candidate deletion.

  (a) its tests pass on the pristine tree;
  (b) they fail once the feature is deleted;
  (c) every other baseline-passing test still passes on the broken tree;
  (d) restoring the original files, in the tree the broken run left behind, makes them pass again.

Cost per candidate: one full-suite run on the broken tree (b and c together) and one run of the
candidate's tests on the restored tree (d). (a) holds already for every test in the baseline
(it passed in every baseline run, inside the full suite); it is re-checked in isolation only
when (d) fails, to tell "fails on its own" (order-dependent tests) from "restore does not fix it".
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from feature_deletion.baseline import copy_tree
from feature_deletion.pytest_run import PytestError, PytestTimeout, run_pytest

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

    @property
    def accepted(self) -> bool:
        return self.reason is None


@dataclass
class Gates:
    pristine: Path                 # never run: every check starts from a fresh copy of it
    work: Path                     # scratch space outside the tree (trees, JUnit files, basetemp)
    pytest_opts: list[str]         # options every run needs (e.g. `-o pythonpath=src`)
    test_targets: list[str]        # what a full-suite run collects (test dirs and files)
    baseline_passing: list[str]
    timeout_s: float
    min_tests: int = 3

    def _run(self, tree: Path, args: list[str], tag: str) -> dict[str, str]:
        return run_pytest(tree, self.pytest_opts + args, tree.parent / f"{tag}.xml", self.timeout_s,
                          basetemp=tree.parent / "basetemp")

    def _fresh(self, slot: str, name: str) -> Path:
        tree = self.work / slot / name
        shutil.rmtree(tree, ignore_errors=True)
        copy_tree(self.pristine, tree)
        return tree

    def check(self, broken: dict[str, str], tests: list[str], slot: str = "0") -> GateResult:
        """`broken`: {relative path: new text}; `tests`: the covering, stable-passing tests.
        Checks running at the same time need different `slot`s (their scratch directories)."""
        try:
            return self._check(broken, tests, slot)
        except PytestTimeout as e:
            return GateResult(TIMEOUT, detail=str(e))
        except PytestError as e:
            return GateResult(PYTEST_ERROR, detail=str(e).splitlines()[0])

    def _check(self, broken: dict[str, str], tests: list[str], slot: str) -> GateResult:
        tree = self._fresh(slot, "gate")
        originals = {rel: (tree / rel).read_bytes() for rel in broken}
        for rel, text in broken.items():
            (tree / rel).write_bytes(text.encode("utf-8"))
        after = self._run(tree, self.test_targets, "broken")
        failing = [t for t in tests if after.get(t) != "passed"]  # absent = did not pass
        if len(failing) < self.min_tests:
            return GateResult(NOT_FAILING, failing, f"{len(failing)}/{len(tests)} tests fail after deletion")
        chosen = set(tests)
        collateral = [t for t in self.baseline_passing if t not in chosen and after.get(t) != "passed"]
        if collateral:
            return GateResult(COLLATERAL, failing, f"{len(collateral)} other tests fail, e.g. {collateral[0]}")
        for rel, data in originals.items():
            (tree / rel).write_bytes(data)
        restored = self._run(tree, failing, "restored")
        if all(restored.get(t) == "passed" for t in failing):
            return GateResult(None, failing)
        alone = self._run(self._fresh(slot, "alone"), failing, "alone")
        bad = [t for t in failing if alone.get(t) != "passed"]
        if bad:
            return GateResult(FAILS_BEFORE, failing, f"{len(bad)} tests fail when run on their own, e.g. {bad[0]}")
        bad = [t for t in failing if restored.get(t) != "passed"]
        return GateResult(RESTORE_FAILS, failing, f"{len(bad)} tests still fail after restoring, e.g. {bad[0]}")

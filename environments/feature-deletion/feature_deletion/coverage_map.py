"""Map each test to the source lines it executes: one pytest run under coverage with one
coverage context per test nodeid (what pytest-cov's `--cov-context=test` does, written out
here because pytest-cov is not a dependency).

coverage's own `dynamic_context = test_function` names the test *function*, which merges the
cases of a parametrized test; switching the context on `item.nodeid` keeps them apart and
matches the nodeids read back from JUnit XML.
"""

from __future__ import annotations

import os
from pathlib import Path

from coverage import CoverageData

from feature_deletion.pytest_run import Outcome, run_pytest

_PLUGIN = '''
import os
import coverage
import pytest

# Started at import: `-p` plugins load before conftest.py and test modules import the project.
_cov = coverage.Coverage(data_file=os.environ["FD_COV_DATA"], config_file=False,
                         include=os.environ["FD_COV_INCLUDE"].split(os.pathsep))
_cov.start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _cov.switch_context(item.nodeid)
    try:
        return (yield)
    finally:
        _cov.switch_context("")


def pytest_unconfigure(config):
    _cov.stop()
    _cov.save()
'''

PLUGIN_NAME = "_fd_coverage_plugin"


def run_with_contexts(tree: Path, args: list[str], include: list[Path], work: Path,
                      timeout_s: float) -> tuple[dict[str, Outcome], dict[Path, dict[int, set[str]]]]:
    """Run the suite under coverage; returns (outcomes, {file: {line: {nodeid...}}}).

    `include` lists source files/dirs to measure (tests are not worth tracing). The plugin and
    the data file live in `work`, outside the tree, so nothing new appears in the tree.
    """
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{PLUGIN_NAME}.py").write_text(_PLUGIN)
    data_file = work / "coverage.db"
    data_file.unlink(missing_ok=True)
    patterns = [str(p) + ("/*" if p.is_dir() else "") for p in include]
    env = {"FD_COV_DATA": str(data_file), "FD_COV_INCLUDE": os.pathsep.join(patterns),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(work), os.environ.get("PYTHONPATH")]))}
    outcomes = run_pytest(tree, ["-p", PLUGIN_NAME, *args], work / "coverage.xml", timeout_s, env=env,
                          basetemp=work / "basetemp")
    data = CoverageData(basename=str(data_file))
    data.read()
    lines: dict[Path, dict[int, set[str]]] = {}
    for name in data.measured_files():
        by_line = {ln: {c for c in ctxs if c} for ln, ctxs in data.contexts_by_lineno(name).items()}
        lines[Path(name).resolve()] = {ln: c for ln, c in by_line.items() if c}
    return outcomes, lines

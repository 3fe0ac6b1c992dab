"""Map each test to the source lines it executes: one pytest run under coverage with one
coverage context per test nodeid (what pytest-cov's `--cov-context=test` does, written out
here because pytest-cov is not a dependency).

coverage's own `dynamic_context = test_function` names the test *function*, which merges the
cases of a parametrized test; switching the context on `item.nodeid` keeps them apart and
matches the nodeids read back from JUnit XML. The run happens in the sandbox (suite.py), so
the file names coverage records are the sandbox's: `read_contexts` maps them back.
"""

from __future__ import annotations

from pathlib import Path

from coverage import CoverageData

# An old-style hook wrapper: works with every pytest a project's constraints may pick.
PLUGIN = '''
import os
import coverage
import pytest

# Started at import: `-p` plugins load before conftest.py and test modules import the project.
_cov = coverage.Coverage(data_file=os.environ["FD_COV_DATA"], config_file=False,
                         include=os.environ["FD_COV_INCLUDE"].split(os.pathsep))
_cov.start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _cov.switch_context(item.nodeid)
    yield
    _cov.switch_context("")


def pytest_unconfigure(config):
    _cov.stop()
    _cov.save()
'''
PLUGIN_NAME = "_fd_coverage_plugin"


def write_plugin(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PLUGIN_NAME}.py").write_text(PLUGIN)
    return directory


def read_contexts(data_file: Path, seen_as: str, tree: Path) -> dict[Path, dict[int, set[str]]]:
    """{file in `tree`: {line: {nodeid...}}} from a coverage data file written by a run that saw
    `tree` at the path `seen_as`."""
    data = CoverageData(basename=str(data_file))
    data.read()
    prefix = seen_as.rstrip("/") + "/"
    lines: dict[Path, dict[int, set[str]]] = {}
    for name in data.measured_files():
        if not name.startswith(prefix):
            continue
        by_line = {ln: {c for c in ctxs if c} for ln, ctxs in data.contexts_by_lineno(name).items()}
        lines[(tree / name[len(prefix):]).resolve()] = {ln: c for ln, c in by_line.items() if c}
    return lines

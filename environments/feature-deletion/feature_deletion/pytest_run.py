"""The pytest command every run of a project's suite uses, and per-test outcomes read back from
its JUnit XML.

Outcomes come from the XML file (written outside the tree), never from stdout: a test suite,
or an agent, can print anything. Every run happens in the sandbox (scoring.sandboxed_pytest):
the generator's, the agent's `run_tests` and the scorer's.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

Outcome = str  # "passed" | "failed" | "error" | "skipped"
_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


class PytestError(RuntimeError):
    """pytest did not produce a report (usage error, crash, missing plugin...)."""


class PytestTimeout(PytestError):
    pass


def pytest_command(tree: Path, args: list[str], junit_path: Path, python: str | None = None,
                   basetemp: Path | None = None) -> list[str]:
    """The argv that runs the suite with `tree` as rootdir (run it with cwd=tree).

    `-p no:cacheprovider` keeps `.pytest_cache` (last failures, test names) out of the tree;
    `--continue-on-collection-errors`: a module that fails to import costs its own tests, not all.
    """
    cmd = [python or sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
           f"--rootdir={tree}", f"--junitxml={junit_path}", "-o", "junit_family=xunit1"]
    if basetemp is not None:
        cmd.append(f"--basetemp={basetemp}")
    return cmd + list(args)


# Every pytest run (generation, tools, scoring; all in the sandbox) sees these.
PYTEST_DETERMINISM = {
    "PYTHONDONTWRITEBYTECODE": "1",  # no .pyc of the pristine source left in the tree
    # Plugins that happen to be installed beside us are not the project's: keep them out (and
    # their start-up cost, ~0.4 s a run). A project needing one passes `-p name` in its args.
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "PYTHONHASHSEED": "0",  # one set iteration order for generation and scoring
}


def neutral_options(plugins: list[str]) -> list[str]:
    """The project's `addopts` (`--cov`, `-n auto`, `--doctest-modules`...) and required plugins
    switched off, and the plugins to load named one by one (autoload is off everywhere)."""
    opts = ["-o", "addopts=", "-o", "required_plugins="]
    for p in plugins:
        opts += ["-p", p]
    return opts


def cause(output: str) -> str:
    """The line of pytest's output that says why it produced no report."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for pick in (lambda ln: ": error:" in ln or ln.startswith("error:"),
                 lambda ln: ln.startswith(("ERROR", "E ")) and "usage:" not in ln,
                 lambda ln: "Error" in ln):
        found = [ln for ln in lines if pick(ln)]
        if found:
            return found[0][:300]
    return (lines[-1] if lines else "no output")[:300]


def parse_junit(report: Path | bytes, tree: Path) -> dict[str, Outcome]:
    """{nodeid: outcome} from a report file or its bytes; a test reported twice (e.g. a teardown
    error) keeps its worst outcome."""
    results: dict[str, Outcome] = {}
    root = ET.fromstring(report) if isinstance(report, bytes) else ET.parse(report).getroot()
    for case in root.iter("testcase"):
        nodeid = junit_nodeid(case.get("classname", ""), case.get("name", ""), case.get("file"), tree)
        outcome = "passed"
        for child in case:
            tag = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(child.tag)
            if tag and _RANK[tag] > _RANK[outcome]:
                outcome = tag
        if _RANK[outcome] >= _RANK.get(results.get(nodeid, "passed"), 0):
            results[nodeid] = outcome
    return results


def junit_nodeid(classname: str, name: str, file: str | None, tree: Path) -> str:
    """Undo pytest's `mangle_test_address`: classname is the file path with '/' turned into '.'
    (and '.py' dropped) followed by the class names; find where the path ends by asking the tree."""
    parts = classname.split(".") if classname else []
    if file and file.endswith(".py"):  # xunit1 gives the file; it is wrong for inherited tests
        stem = file[:-3].replace("/", ".").split(".")
        if parts[:len(stem)] == stem:
            return "::".join([file, *parts[len(stem):], name])
    for k in range(len(parts), 0, -1):
        path = "/".join(parts[:k]) + ".py"
        if (tree / path).is_file():
            return "::".join([path, *parts[k:], name])
    if not parts:  # a collection error reports the module itself: name is the dotted path
        path = name.replace(".", "/") + ".py"
        if (tree / path).is_file():
            return path
    return "::".join([*parts, name])

"""Run a source's test suite for the generator the way scoring runs it: in the sandbox, with the
source's test environment (testenv.py) at /sandbox/site, tests and runner config read-only,
outcomes from the JUnit XML only. The baseline, the coverage map and the gates therefore see
exactly what the agent's `run_tests` and the scorer will see.

A run without a report raises PytestError naming pytest's own reason (`cause`); its full output
goes to the build log (`detail`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from feature_deletion import sandbox
from feature_deletion.coverage_map import PLUGIN_NAME, read_contexts, write_plugin
from feature_deletion.pytest_run import Outcome, PytestError, PytestTimeout, cause
from feature_deletion.scoring import SANDBOX_OUT, protected_paths, sandboxed_pytest

PLUGIN_MOUNT = "/sandbox/cov"


@dataclass
class Suite:
    site: Path | None                 # the test environment; None: this venv's allow-list
    env: dict                         # environment variables of every run (see scoring.suite_env)
    hidden: list[str]                 # the project's own top-level modules
    test_paths: list[str]             # mounted read-only, like scoring does
    limits: sandbox.Limits
    detail: Callable[[str], None] = field(default=lambda m: None)  # the build log's full-output channel

    def run(self, tree: Path, args: list[str], out: Path, timeout_s: float, *, extra_env: dict | None = None,
            mounts: Sequence[sandbox.Mount] = (), keep_output: bool = False) -> dict[str, Outcome]:
        """The run's outcomes; `keep_output`: its output goes to the build log even when it worked."""
        out.mkdir(parents=True, exist_ok=True)
        frozen = [sandbox.Mount(tree / rel, f"{sandbox.SANDBOX_REPO}/{rel}")
                  for rel in protected_paths({"test_paths": self.test_paths}, tree, None)]
        outcomes, problem, res = sandboxed_pytest(tree, out, args, "junit.xml", timeout_s, self.limits, self.hidden,
                                                  [*frozen, *mounts], site=self.site, env={**self.env, **(extra_env or {})})
        output = (res.stdout + res.stderr).rstrip()
        if res.timed_out:
            self.detail(f"pytest {' '.join(args)}: killed after {timeout_s:.0f} s; its output:\n{output}")
            raise PytestTimeout(f"pytest ran past {timeout_s:.0f} s")
        if problem:
            self.detail(f"pytest {' '.join(args)}: exit code {res.returncode}, {problem}; its output:\n{output}")
            raise PytestError(f"pytest exited {res.returncode} without a report: {cause(output)}")
        if keep_output:
            self.detail(f"pytest {' '.join(args)}: exit code {res.returncode}; its output:\n{output}")
        return outcomes

    def coverage(self, tree: Path, args: list[str], include: list[Path], work: Path,
                 timeout_s: float) -> tuple[dict[str, Outcome], dict[Path, dict[int, set[str]]]]:
        """Run the suite under coverage, one context per test; returns (outcomes,
        {file: {line: {nodeid...}}}). `include`: the source files and directories to measure."""
        plugin = write_plugin(work / "plugin")
        out = work / "out"
        patterns = [f"{sandbox.SANDBOX_REPO}/{p.relative_to(tree).as_posix()}" + ("/*" if p.is_dir() else "")
                    for p in include]
        env = {"FD_COV_DATA": f"{SANDBOX_OUT}/coverage.db", "FD_COV_INCLUDE": os.pathsep.join(patterns),
               "PYTHONPATH": f"{sandbox.SANDBOX_SITE}{os.pathsep}{PLUGIN_MOUNT}"}
        outcomes = self.run(tree, ["-p", PLUGIN_NAME, *args], out, timeout_s, extra_env=env,
                            mounts=[sandbox.Mount(plugin, PLUGIN_MOUNT)])
        if not (out / "coverage.db").is_file():
            raise PytestError("the coverage run wrote no data")
        return outcomes, read_contexts(out / "coverage.db", sandbox.SANDBOX_REPO, tree)

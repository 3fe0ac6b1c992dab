"""Which functions of a source tree become candidates: sized 5-80 body lines, covered by at
least 3 stable tests and at most 20% of the suite, none of them unstable (see Settings), each
rejected one counted under its reason."""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from feature_deletion.baseline import Layout
from feature_deletion.deletion import Function, apply_deletions, find_functions, private_helpers, references

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
    # the test environment (testenv.py) and how pytest runs (pytest_run.neutral_options)
    deps: list[str] = field(default_factory=list)      # installed besides what the project declares
    declared_deps: bool = True                         # install what the project declares
    keep_pytest_config: bool = False                   # keep the project's addopts and plugin autoload
    pytest_plugins: list[str] | None = None            # `-p` modules; None: those the test env provides


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

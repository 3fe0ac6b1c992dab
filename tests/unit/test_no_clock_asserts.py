"""No test asserts how fast something ran (docs/testing.md, "Nothing timed by the clock"; issue 42): every
ordering comparison in an `assert` that reads a duration or the clock (a name like `seconds`, `elapsed`,
`wall_s`, `*_s`, `time.monotonic()`) is either a wait's deadline (`time.monotonic() < deadline`, the
`deadline` a timeout) or a timeout test that says its margin in a comment within three lines above it.
A duration that must only have been measured is `recorded(...)` (tests/support/bench_runs.py), not `> 0`."""

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

CLOCK = re.compile(r"(^|_)(seconds|elapsed|wall|monotonic|perf_counter)$|(?<!_per)_s$")  # not a rate: tokens_per_s
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _names(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
            out.add(n.slice.value)
    return out


def clock_asserts(source: str) -> list[int]:
    """Lines of `source` whose assert orders a duration or the clock without a deadline or a stated margin."""
    lines, found = source.splitlines(), []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            if not any(isinstance(op, ORDER) for op in cmp.ops):
                continue
            names = _names(cmp)
            if "deadline" in names or not any(CLOCK.search(n) for n in names):
                continue
            said = " ".join(lines[max(0, node.lineno - 4):node.end_lineno]).lower()
            if not ("timeout" in said and "margin" in said):
                found.append(cmp.lineno)
    return found


# hand-made test sources the detector reads (text, not assertions of this file)
TIMED = "assert out['wall_s'] < 30\nassert 3 <= seconds\nassert time.monotonic() - t0 < 9\n"
TIMEOUT_TEST = "# a timeout test: 5x margin over a fast host\nassert elapsed < 15\n"
DEADLINE_AND_COUNT = "assert p.poll() is None and time.monotonic() < deadline\nassert r['tokens'] > 0\n"
MEASURED = "assert recorded(r['gen_s']) and r['wall_s'] == round(t, 1) and r['tokens_per_s'] > 0\n"


def test_the_detector_finds_a_clock_assert_and_passes_a_timeout_test_with_its_margin():
    assert clock_asserts(TIMED) == [1, 2, 3]
    assert clock_asserts(TIMEOUT_TEST) == clock_asserts(DEADLINE_AND_COUNT) == clock_asserts(MEASURED) == []


def test_no_test_asserts_how_long_anything_took():
    files = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "environments").glob("*/tests/**/*.py")]
    found = {str(f.relative_to(ROOT)): lines for f in files
             if "fixtures" not in f.parts and (lines := clock_asserts(f.read_text()))}
    assert found == {}, f"asserts on how long something took (docs/testing.md): {found}"

"""Helpers for the sandbox, tools, scoring and red-team tests: a hand-made task set in the
generator's format (the host guard and tree digests live in feature_deletion.hostguard)."""

from __future__ import annotations

import json
from pathlib import Path

from feature_deletion.sandbox import Limits


MINILIB = Path(__file__).parent / "fixtures" / "minilib"
DEPLIB = Path(__file__).parent / "fixtures" / "deplib"
SRCLIB = Path(__file__).parent / "fixtures" / "srclib"
# Tight limits and timeouts for red-team runs on the fixtures (their suites take about a second).
REDTEAM_LIMITS = Limits(memory_mb=384, nproc=48, cpu_s=30, fsize_mb=8, tmp_mb=64)
REDTEAM_TIMEOUTS = (6.0, 12.0)  # run_tests, scoring
HANDMADE_TASK = "tinylib.stats--mean--body"  # the one task of make_handmade_taskset
STATS_BROKEN = '''"""Small statistics helpers."""


def mean(xs):
    """Arithmetic mean; ValueError on an empty sequence."""
    raise NotImplementedError


def double(x):
    """2 * x, for numbers and sequences."""
    return 2 * x
'''
STATS_SOLUTION = STATS_BROKEN.replace(
    "    raise NotImplementedError\n",
    "    xs = list(xs)\n    if not xs:\n        raise ValueError('mean of nothing')\n    return sum(xs) / len(xs)\n",
)
STATS_PARTIAL = STATS_BROKEN.replace("    raise NotImplementedError\n", "    return sum(xs) // len(xs)\n")
TESTS = '''import pytest

from tinylib import double, mean


def test_mean_ints():
    assert mean([1, 2, 3]) == 2


def test_mean_single():
    assert mean([2]) == 2


def test_mean_fraction():
    assert mean([1, 2]) == 1.5


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])


def test_double():
    assert double(4) == 8


def test_double_str():
    assert double("ab") == "abab"
'''
MEAN_TESTS = [f"tests/test_stats.py::test_mean_{n}" for n in ("empty", "fraction", "ints", "single")]
ALL_TESTS = sorted(MEAN_TESTS + ["tests/test_stats.py::test_double", "tests/test_stats.py::test_double_str"])


def build_in(tmp_path_factory, name: str, source: Path, **kw) -> tuple[dict, Path]:
    """(manifest, task set) built by the real generator from `source` into a fresh directory,
    two cores, no progress output; `kw` goes to `build` (max_tasks, seed, variant...)."""
    from feature_deletion.generate import build

    out = tmp_path_factory.mktemp(name) / "set"
    return build(str(source), out, **{"seed": 0, "jobs": 2, "log": lambda m: None, **kw}), out


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def make_handmade_taskset(out: Path) -> Path:
    """One task, `tinylib.stats.mean` deleted, in the exact on-disk format of the generator."""
    task = {
        "id": HANDMADE_TASK, "file": "tinylib/stats.py", "qualname": "mean",
        "deleted": [{"file": "tinylib/stats.py", "qualname": "mean", "lineno": 4, "end_lineno": 6, "kind": "body"}],
        "tests": MEAN_TESTS, "baseline_passing": ALL_TESTS, "test_paths": ["pyproject.toml", "tests"],
        "pytest_args": ["tests"], "body_lines": 4, "n_tests": len(MEAN_TESTS), "variant": "body",
    }
    tdir = out / "tasks" / task["id"]
    write_tree(tdir / "repo", {
        "tinylib/__init__.py": "from tinylib.stats import double, mean\n",
        "tinylib/stats.py": STATS_BROKEN, "tests/test_stats.py": TESTS,
        "pyproject.toml": '[project]\nname = "tinylib"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n',
    })
    write_tree(tdir / "solution", {"tinylib/stats.py": STATS_SOLUTION})
    (tdir / "task.json").write_text(json.dumps(task, indent=2))
    manifest = {"format": 1, "env": "feature-deletion", "seed": 0, "variant": "body",
                "source": {"kind": "dir", "origin": "handmade"}, "report": {}, "tasks": [task]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out

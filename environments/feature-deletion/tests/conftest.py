"""Shared fixtures of the feature-deletion tests (append yours; keep each section self-contained)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

# -- sandbox, tools, scoring, red team -----------------------------------------------------------
from sandbox_support import MINILIB, make_handmade_taskset


@pytest.fixture
def handmade_taskset(tmp_path: Path) -> Path:
    """A one-task set (tinylib.stats.mean deleted) written by hand in the generator's format."""
    return make_handmade_taskset(tmp_path / "handmade")


@pytest.fixture(scope="session")
def minilib_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tasks built by the real generator from the minilib fixture (read-only: copy to change)."""
    from feature_deletion.generate import build

    out = tmp_path_factory.mktemp("minilib-built") / "set"
    build(str(MINILIB), out, seed=0, max_tasks=2, log=lambda m: None)
    return out


@pytest.fixture
def minilib_taskset(minilib_built: Path, tmp_path: Path) -> Path:
    """A private copy of the generator-built set, safe to plant things in."""
    dst = tmp_path / "minilib-set"
    shutil.copytree(minilib_built, dst, symlinks=True)
    return dst

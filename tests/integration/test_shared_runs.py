"""The session's shared runs (tests/support/shared_runs.py `once`): a maker that dies without raising (as
pytest-timeout's thread method ends a worker, with os._exit) leaves a marker, and the next reader fails at
once naming it, where it used to make the whole run again in silence (25 minutes on a slow host)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.shared_runs import once

# a worker's maker, killed mid-run the way pytest-timeout's thread method kills it (os._exit: no except, no finally)
DIES = """
import os, sys
from pathlib import Path
from tests.support.shared_runs import once

class Factory:
    def getbasetemp(self): return Path(sys.argv[1])
    def mktemp(self, name): p = Path(sys.argv[1]) / name; p.mkdir(); return p

once("run", Factory(), lambda tmp: os._exit(1))
"""


class Factory:
    def __init__(self, base: Path) -> None:
        self.base = base

    def getbasetemp(self) -> Path:
        return self.base

    def mktemp(self, name: str) -> Path:
        (p := self.base / f"{name}-{len(list(self.base.iterdir()))}").mkdir()
        return p


def test_a_maker_killed_mid_run_fails_the_next_reader_at_once(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the session's own directory, as without workers
    r = subprocess.run([sys.executable, "-c", DIES, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and (tmp_path / "run.started").exists() and not (tmp_path / "run.pickle").exists()
    made = []
    with pytest.raises(pytest.fail.Exception, match="(?s)the shared run run failed .*its maker \\(pid \\d+, worker main\\) died"):
        once("run", Factory(tmp_path), made.append)
    assert made == []  # not made again
    with pytest.raises(pytest.fail.Exception, match="died before it finished"):  # and every later reader the same
        once("run", Factory(tmp_path), made.append)


def test_a_run_is_made_once_and_read_by_every_reader(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    made = []
    assert once("ok", Factory(tmp_path), lambda tmp: made.append(tmp) or 7) == 7
    assert once("ok", Factory(tmp_path), lambda tmp: made.append(tmp) or 8) == 7 and len(made) == 1

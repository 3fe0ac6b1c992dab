"""Bad input, tried as a new user types it (tests/integration/test_bad_input*.py): the real command
as a subprocess must exit 2 with one line on stderr and no traceback, and write nothing. The subprocess is
forked by the worker's fork server (tests/support/forkserver.py: the command's own `main`, in a child that has the
environment and argv a fresh interpreter would) where it serves the command, as it serves the suite's runs: about
a second of imports a row saved (105 rows in test_bad_input*.py: 112 s one at a time, 52 s forked, 2026-12-07).

A row's argv and expected text may name the scaffold (`{tmp}`, `{file}`, `{dir}`, `{jsonl}`) and
whatever else the test adds to its substitutions; the expected text is part of the line, or its
end where it ends in `$`."""

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.support import forkserver

CHAT = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'


def fill(text: str, subs: dict[str, str]) -> str:
    for k, v in subs.items():
        text = text.replace("{" + k + "}", v)
    return text


def scaffold(tmp_path: Path) -> dict[str, str]:
    """A file, an empty directory and a chat JSONL in tmp_path: the substitutions naming them."""
    (tmp_path / "a-file").write_text("not a directory")
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "ok.jsonl").write_text(CHAT)
    return {"tmp": str(tmp_path), "file": str(tmp_path / "a-file"), "dir": str(tmp_path / "a-dir"),
            "jsonl": str(tmp_path / "ok.jsonl")}


def listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def run_bad_input(module: str, argv: list[str], expected: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m module argv` from the repository root must answer with exit code 2 and the one
    line `expected` says, no traceback (argv and expected already filled in)."""
    r = forkserver.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, cwd=ROOT,
                       timeout=timeout, env={**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr + r.stdout
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    line = r.stderr.strip()
    assert line.endswith(expected[:-1]) if expected.endswith("$") else expected in line, line
    return r

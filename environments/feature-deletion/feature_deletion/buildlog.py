"""The build log: progress lines go to the caller (stderr) and the log file, full pytest and uv
output to the file only. It lives beside the task set (`<out>.build.log`), so it survives a
failed build, which leaves no task set behind."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, TextIO


def log_path(out: Path) -> Path:
    return out.with_name(out.name + ".build.log")


def stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


Counted = Callable[[int, int], None]  # told (done, total) as a long loop goes: the caller shows progress


def uncounted(done: int, total: int) -> None:
    """The default `Counted`: a caller that shows no progress (the log lines still tell it)."""


class BuildLog:
    def __init__(self, path: Path | None, echo: Callable[[str], None] = stderr) -> None:
        self.path, self.echo = path, echo
        self._file: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "w", encoding="utf-8", buffering=1)

    def __call__(self, msg: str, echo: bool = True) -> None:
        self._write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")
        if echo:
            self.echo(msg)

    def detail(self, text: str) -> None:
        self._write("".join(f"    {ln}\n" for ln in text.rstrip().splitlines()))

    def _write(self, text: str) -> None:
        if self._file is not None:
            self._file.write(text)

    def where(self) -> str:
        return f" (full output: {self.path})" if self.path else ""

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def summary_lines(manifest: dict) -> list[str]:
    """The end-of-build summary: counts, then every rejected function and why (gate rejections
    with their detail; the static filters' rejections by reason)."""
    r = manifest["report"]
    lines = [f"{r['accepted']} tasks accepted of {r['candidates']} functions ({r['passed_filters']} passed the "
             f"filters, {r['not_evaluated']} not checked); {r['seconds']['total']:.1f} s"]
    for g in r.get("gate_rejections", []):
        lines.append(f"  rejected {g['function']}: {g['reason']} ({g['detail']})")
    gate_reasons = {g["reason"] for g in r.get("gate_rejections", [])}
    for reason, names in r["rejected_examples"].items():
        if reason not in gate_reasons:
            more = r["rejected"][reason] - len(names)
            lines.append(f"  rejected {reason} ({r['rejected'][reason]}): {', '.join(names)}"
                         + (f" and {more} more (all in the build log)" if more else ""))
    return lines


def index_lines(index: dict) -> list[str]:
    """The end-of-build summary of a list of sources."""
    ok = [s for s in index["sources"] if s["status"] == "ok"]
    lines = [f"{len(index['tasks'])} tasks from {len(ok)} of {len(index['sources'])} sources"]
    for s in index["sources"]:
        if s["status"] == "ok":
            r = s["report"]
            lines.append(f"  {s['source']}: {s['accepted']} tasks of {r['candidates']} functions, rejected {r['rejected']}")
        else:
            lines.append(f"  {s['source']}: {s['status']}{': ' + s['error'] if s.get('error') else ''}")
    return lines

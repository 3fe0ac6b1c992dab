"""The per-rollout tool session (protocol: docs/environments.md "Tool sessions").

The agent works on a private copy of the task's `repo/`. File tools run here, on the host, and
confine every path to that copy (no absolute paths, no `..`, no symlink leading out); anything
that executes the agent's code (`run_tests`, and `grep`, so a pathological regex cannot hang us)
runs in the sandbox. Errors come back as `is_error=True` with a message naming what was wrong.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feature_deletion import sandbox
from feature_deletion.scoring import (copy_clean, sandboxed_pytest, source_roots, suite_env, task_test_args,
                                      top_level_modules)
from feature_deletion.taskdir import load_task
from feature_deletion.tool_schemas import TOOLS, ToolError, check_arguments

MAX_READ_BYTES = 4 << 20
GREP_SCRIPT = r"""
import os, re, sys
pattern, start, limit = re.compile(sys.argv[1]), sys.argv[2], int(sys.argv[3])
found = 0
paths = [start] if os.path.isfile(start) else (
    os.path.join(d, f) for d, dirs, files in os.walk(start) if not dirs.sort() for f in sorted(files))
for path in paths:
    if os.path.islink(path) or os.path.getsize(path) > 1 << 20:
        continue
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except (UnicodeDecodeError, OSError):
        continue
    for n, line in enumerate(lines, 1):
        if pattern.search(line):
            found += 1
            if found > limit:
                print(f"[... more than {limit} matches, narrow the pattern or the path]")
                sys.exit(0)
            print(f"{os.path.relpath(path)}:{n}: {line[:300]}")
print("" if found else "no matches")
"""


@dataclass(frozen=True)
class SessionConfig:
    limits: sandbox.Limits = sandbox.Limits()
    test_timeout_s: float = 120.0
    grep_timeout_s: float = 20.0
    max_read_chars: int = 20_000
    max_write_bytes: int = 256 << 10
    max_list_entries: int = 400
    max_grep_matches: int = 200
    max_output_chars: int = 6_000


@dataclass
class ToolLog:
    calls: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)  # (tool, message): for hint distillation


class FeatureDeletionSession:
    """One rollout's working copy and tools. `repo` is the agent's tree, scored after the episode."""

    def __init__(self, task_dir: Path, config: SessionConfig = SessionConfig()) -> None:
        self.task_dir, self.config = Path(task_dir), config
        self.task = load_task(self.task_dir)
        self.root = Path(tempfile.mkdtemp(prefix="fd-session-"))
        self.repo = self.root / "repo"
        copy_clean(self.task_dir / "repo", self.repo)
        # the task's own top-level module: never allowed on the sandbox's site allow-list
        self.hidden = top_level_modules(source_roots(self.task, self.task_dir / "repo"))
        self.site, self.env = suite_env(self.task_dir, self.task)
        self.tools: list[dict] = TOOLS
        self.log = ToolLog()
        self.submitted = False
        self.score: Any = None  # set by the task's reward, shared with its metrics
        self.closed = False

    async def call(self, name: str, arguments: dict) -> dict:
        self.log.calls += 1
        try:
            if self.closed:
                raise ToolError("the session is closed")
            args = check_arguments(name, arguments)
            handler = getattr(self, f"_{name}")
            content, done = await handler(**args)
            return {"content": content, "is_error": False, "done": done}
        except (ToolError, OSError, UnicodeError) as e:  # sandbox failures are not the agent's: they raise
            message = str(e) if isinstance(e, ToolError) else f"{type(e).__name__}: {e}"
            self.log.errors.append((str(name), message))
            return {"content": f"Error: {message}", "is_error": True, "done": False}

    async def close(self) -> None:
        self.closed = True
        await asyncio.to_thread(shutil.rmtree, self.root, True)

    # -- paths ---------------------------------------------------------------------------

    def resolve(self, path: str, *, must_exist: bool = True) -> Path:
        """`path` inside the working copy, or ToolError saying why not."""
        if "\x00" in path:
            raise ToolError("path contains a NUL byte")
        if path.startswith(("/", "~")) or re.match(r"^[A-Za-z]:[\\/]", path):
            raise ToolError(f"path must be relative to the repository root, got {path!r}")
        if ".." in Path(path).parts:
            raise ToolError(f"path may not contain '..': {path!r}")
        full = (self.repo / path).resolve()
        if not full.is_relative_to(self.repo.resolve()):
            raise ToolError(f"{path!r} leads outside the repository (through a symlink)")
        if must_exist and not full.exists():
            hint = self._nearby(path)
            raise ToolError(f"file not found: {path!r}{hint}")
        return full

    def _regular_file(self, path: str) -> Path:
        # not a directory, and not a FIFO the agent's code made: reading one would block us
        full = self.resolve(path)
        if full.is_dir():
            raise ToolError(f"{path!r} is a directory (use list_dir)")
        if not full.is_file():
            raise ToolError(f"{path!r} is not a regular file")
        return full

    def _nearby(self, path: str) -> str:
        parent = (self.repo / path).parent
        if parent.is_dir() and parent.resolve().is_relative_to(self.repo.resolve()):
            names = sorted(p.name + ("/" if p.is_dir() else "") for p in parent.iterdir())[:30]
            where = parent.relative_to(self.repo).as_posix() or "."
            return f" ({where} contains: {', '.join(names) or 'nothing'})"
        return " (use list_dir to see the tree)"

    def _rel(self, p: Path) -> str:
        return p.relative_to(self.repo.resolve()).as_posix() or "."

    # -- tools ---------------------------------------------------------------------------

    async def _list_dir(self, path: str = ".", depth: int = 1) -> tuple[str, bool]:
        top = self.resolve(path)
        if not top.is_dir():
            raise ToolError(f"not a directory: {path!r} (use read_file for files)")
        if not 1 <= depth <= 4:
            raise ToolError(f"depth must be between 1 and 4, got {depth}")
        lines: list[str] = []

        def walk(d: Path, level: int) -> None:
            for p in sorted(d.iterdir()):
                if len(lines) >= self.config.max_list_entries:
                    return
                is_dir = p.is_dir() and not p.is_symlink()
                lines.append("  " * (level - 1) + p.name + ("/" if is_dir else ""))
                if is_dir and level < depth:
                    walk(p, level + 1)

        walk(top, 1)
        if len(lines) >= self.config.max_list_entries:
            lines.append(f"[... listing stopped at {self.config.max_list_entries} entries]")
        return ("\n".join(lines) or "(empty directory)"), False

    async def _read_file(self, path: str, start_line: int | None = None,
                         end_line: int | None = None) -> tuple[str, bool]:
        full = self._regular_file(path)
        with open(full, "rb") as f:
            data = f.read(MAX_READ_BYTES)
        if b"\x00" in data[:8192]:
            raise ToolError(f"{path!r} is a binary file")
        lines = data.decode("utf-8", errors="replace").splitlines()
        start = start_line or 1
        end = min(end_line or len(lines), len(lines))
        if start < 1 or (end_line is not None and end_line < start):
            raise ToolError(f"bad line range {start_line}..{end_line} (lines are numbered from 1)")
        if start > max(len(lines), 1):
            raise ToolError(f"{path!r} has only {len(lines)} lines")
        text = "\n".join(f"{n:>5}\t{lines[n - 1]}" for n in range(start, end + 1))
        if len(text) > self.config.max_read_chars:
            text = text[: self.config.max_read_chars]
            text += "\n[... truncated: ask for a line range with start_line/end_line]"
        return text or "(empty file)", False

    async def _write_file(self, path: str, content: str) -> tuple[str, bool]:
        if len(content.encode()) > self.config.max_write_bytes:
            raise ToolError(f"content is larger than {self.config.max_write_bytes} bytes")
        full = self.resolve(path, must_exist=False)
        if full.exists() and not full.is_file():
            raise ToolError(f"{path!r} is a directory or a special file, not a regular file")
        full.parent.mkdir(parents=True, exist_ok=True)
        self.resolve(path, must_exist=False)  # the parents just made cannot be links, but check
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        return f"wrote {len(content.splitlines())} lines to {self._rel(full)}", False

    async def _edit(self, path: str, old: str, new: str) -> tuple[str, bool]:
        full = self._regular_file(path)
        if full.stat().st_size > self.config.max_write_bytes:
            raise ToolError(f"{path!r} is larger than {self.config.max_write_bytes} bytes: too large to edit")
        text = full.read_text(encoding="utf-8", errors="replace")
        if not old:
            raise ToolError("'old' is empty: give the exact text to replace (or use write_file)")
        count = text.count(old)
        if count == 0:
            raise ToolError(f"'old' text not found in {path!r} "
                            "(it must match exactly, whitespace included; read_file first)")
        if count > 1:
            raise ToolError(f"'old' text occurs {count} times in {path!r}: "
                            "include more surrounding lines to make it unique")
        await self._write_file(path, text.replace(old, new, 1))
        return f"replaced 1 occurrence in {self._rel(full)}", False

    async def _grep(self, pattern: str, path: str = ".") -> tuple[str, bool]:
        try:
            re.compile(pattern)
        except re.error as e:
            raise ToolError(f"bad regular expression {pattern!r}: {e}") from None
        target = self._rel(self.resolve(path))
        cmd = sandbox.python_argv("-c", GREP_SCRIPT, pattern, target, str(self.config.max_grep_matches))
        res = await asyncio.to_thread(sandbox.run, cmd, self.repo, self.config.grep_timeout_s, self.config.limits,
                                      hidden_modules=self.hidden)
        if res.timed_out:
            raise ToolError(f"grep timed out after {self.config.grep_timeout_s:.0f} s (simplify the pattern)")
        if res.returncode != 0:
            raise ToolError(f"grep failed: {res.stderr.strip()[-500:]}")
        return self._cap(res.stdout.rstrip("\n")), False

    async def _run_tests(self, tests: list[str] | None = None) -> tuple[str, bool]:
        targets = tests or list(self.task["tests"])
        for t in targets:
            if t.startswith("-"):
                raise ToolError(f"tests are test ids or paths, not options: {t!r}")
            self.resolve(t.split("::")[0])
        out = self.root / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        outcomes, problem, res = await asyncio.to_thread(
            sandboxed_pytest, self.repo, out, task_test_args(self.task, targets), "junit.xml",
            self.config.test_timeout_s, self.config.limits, self.hidden, site=self.site, env=self.env)
        return self._cap(_summary(outcomes, problem, res, self.config.test_timeout_s)), False

    async def _submit(self) -> tuple[str, bool]:
        self.submitted = True
        return "Submitted. Your changes will now be scored.", True

    def _cap(self, text: str) -> str:
        n = self.config.max_output_chars
        return text if len(text) <= n else text[: n // 3] + "\n[... truncated ...]\n" + text[-(2 * n) // 3 :]


def _summary(outcomes: dict[str, str], problem: str | None, res: sandbox.Result, timeout_s: float) -> str:
    head = []
    if res.timed_out:
        head.append(f"The test run timed out after {timeout_s:.0f} s and was killed.")
    if problem:
        head.append(f"No test report ({problem}); pytest exited with code {res.returncode}.")
    else:
        counts: dict[str, int] = {}
        for o in outcomes.values():
            counts[o] = counts.get(o, 0) + 1
        head.append(", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "no tests ran")
        bad = sorted(t for t, o in outcomes.items() if o in ("failed", "error"))
        if bad:
            head.append("Not passing:\n" + "\n".join(f"  {t}" for t in bad[:30]))
    output = (res.stdout + res.stderr).strip()
    return "\n".join(head) + ("\n\npytest output:\n" + output if output else "")

"""`composer-prime traces ingest PATH... --out F`: recorded agent sessions to normalised steps.

Files and directories (recursive) in any mix; each file's format is read from its first record:
Claude Code session JSONL (claude_code.py), OpenAI chat logs, our own recorded rollouts
included (openai_chat.py), or OpenEnv `TrainingTrace` exports of its capture proxy
(openenv_trace.py; a malformed one stops the command). Sub-agent files (`agent-*.jsonl`,
anything under `subagents/`) are the sub-agent's own sessions: skipped by default, their own
traces with `--keep-sidechains`.
Prints one summary row per file (records, steps, skipped by reason) and writes every step to
`--out` at the end, in one rename: an interrupted ingest writes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from composer_prime.traces import claude_code, openai_chat, openenv_trace
from composer_prime.traces.record import Step, write_steps
from composer_prime.utils.fs import check_writable_file

SUFFIXES = (".jsonl", ".json")


class IngestError(Exception):
    """Bad input for the whole command: one line, exit code 2."""


def files(paths: list[Path], keep_sidechains: bool, counts: Counter) -> list[Path]:
    out = []
    for p in paths:
        if not p.exists():
            raise IngestError(f"{p}: no such file or directory")
        found = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
        for f in found:
            if not f.name.endswith(SUFFIXES) or f.name.endswith(".meta.json"):
                continue
            if not keep_sidechains and (f.name.startswith("agent-") or "subagents" in f.parts):
                counts["skipped_files/subagent"] += 1
                continue
            out.append(f)
    return out


def detect(path: Path) -> str:
    """"claude-code", "openai", "openenv" or "unknown", from the first record that parses (or the
    whole file: an OpenEnv export may be one JSON document over many lines)."""
    if path.suffix == ".json" and openenv_trace.document(path) is not None:
        return "openenv"
    with path.open("rb") as fh:
        for raw in fh:
            try:
                entry = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(entry, dict) and openenv_trace.looks_like(entry):
                return "openenv"
            if isinstance(entry, dict) and openai_chat.looks_like(entry):
                return "openai"
            if isinstance(entry, dict) and ("sessionId" in entry or "uuid" in entry or "leafUuid" in entry):
                return "claude-code"
            return "unknown"
    return "unknown"


def ingest(paths: list[Path], keep_sidechains: bool = False) -> tuple[list[Step], list[dict], list[str], Counter]:
    """(steps, one summary row per file, warnings, counts over all files)."""
    total: Counter = Counter()
    rows, warnings, steps = [], [], []
    for f in files(paths, keep_sidechains, total):
        kind = detect(f)
        if kind == "claude-code":
            got, counts, warns = claude_code.parse(f, keep_sidechains)
        elif kind == "openai":
            got, counts, warns = openai_chat.parse(f)
        elif kind == "openenv":
            try:
                got, counts, warns = openenv_trace.parse(f)
            except openenv_trace.MalformedTrace as e:
                raise IngestError(str(e)) from None
        else:
            total["skipped_files/unknown_format"] += 1
            continue
        steps += got
        warnings += warns
        total.update(counts)
        rows.append({"file": str(f), "format": kind, **counts})
    return steps, rows, warnings, total


def table(rows: list[dict]) -> str:
    lines = [f"{'file':<48} {'format':<12} {'records':>8} {'steps':>6}  skipped"]
    for r in rows:
        skipped = ", ".join(f"{k.split('/', 1)[1]} {v}" for k, v in sorted(r.items()) if k.startswith("skipped/")) or "-"
        name = r["file"] if len(r["file"]) <= 48 else "..." + r["file"][-45:]
        lines.append(f"{name:<48} {r['format']:<12} {r.get('records', 0):>8} {r.get('steps', 0):>6}  {skipped}")
    return "\n".join(lines)


def check_out(out: Path) -> None:
    """Before any work: `--out` must be a file this process can write."""
    try:
        check_writable_file(out)
    except OSError as e:
        raise IngestError(f"--out: {e}") from None


def run(args: argparse.Namespace) -> int:
    try:
        check_out(Path(args.out))
        steps, rows, warnings, total = ingest([Path(p).expanduser() for p in args.paths], args.keep_sidechains)
        if not steps:
            raise IngestError(f"no assistant steps found in {', '.join(args.paths)} ({dict(total) or 'no session files'})")
        print(table(rows))
        for w in warnings:
            print(f"warning: {w}")
        write_steps(steps, Path(args.out))
    except IngestError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename or args.out}: {e.strerror}", file=sys.stderr)
        return 2
    files_skipped = ", ".join(f"{k.split('/', 1)[1]} {v}" for k, v in sorted(total.items()) if k.startswith("skipped_files/"))
    print(f"{len(steps)} steps from {len(rows)} files -> {args.out}" + (f" (files skipped: {files_skipped})" if files_skipped else ""))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("ingest", help="recorded agent sessions (Claude Code JSONL, OpenAI chat logs, OpenEnv TrainingTrace exports) to steps")
    p.add_argument("paths", nargs="+", help="session files or directories (searched recursively)")
    p.add_argument("--out", required=True, help="where the steps go (JSONL)")
    p.add_argument("--keep-sidechains", action="store_true", help="keep sub-agent sessions, each as its own trace")
    p.set_defaults(func=run)
    return p

"""`composer-prime env redteam TASKS_DIR [--tasks N]`: audit a Feature Deletion task set.

    composer-prime env redteam outputs/tasks/inflection
    composer-prime env redteam outputs/tasks/many --tasks 12 --json redteam.json

Every scripted cheating agent runs against a copy of each chosen task (one per source by
default); per attack: its score, the defence that stopped it, and a control showing the attack
works where that defence is off. Exit code 0 when every attack scored 0 for its intended
reason, 1 when one did not, 2 on bad input. The logic lives in feature_deletion.redteam.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from composer_prime.utils.fs import check_writable_file
from composer_prime.utils.progress import Progress


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("redteam", help="run every scripted attack against tasks of a feature-deletion task set",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tasks_dir", type=Path, help="a task set built by `env build-tasks feature-deletion`")
    p.add_argument("--tasks", type=int, default=None, help="how many tasks to attack (default: one per source)")
    p.add_argument("--attacks", default=None, help="comma-separated attack names (default: all)")
    p.add_argument("--json", type=Path, default=None, help="write every result to this file")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    manifest = args.tasks_dir / "manifest.json"
    if not manifest.is_file():
        print(f"error: no manifest.json in {args.tasks_dir}: not a built task set", file=sys.stderr)
        return 2
    try:
        json.loads(manifest.read_text())
    except (OSError, ValueError) as e:
        print(f"error: {manifest}: not a task set's manifest ({e})", file=sys.stderr)
        return 2
    if args.tasks is not None and args.tasks < 1:
        print("error: --tasks must be at least 1", file=sys.stderr)
        return 2
    if args.json:  # before the attacks run, not after them
        try:
            check_writable_file(args.json)
        except OSError as e:
            print(f"error: --json: {e}", file=sys.stderr)
            return 2
    from feature_deletion.redteam import audit, summary

    attacks = args.attacks.split(",") if args.attacks else None
    try:
        with Progress("redteam", None, "attacks") as progress:
            results = audit(args.tasks_dir.resolve(), args.tasks, attacks, log=progress.echo, progress=progress.update)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    s = summary(results)
    if args.json:
        args.json.write_text(json.dumps(s, indent=2) + "\n")
    print(f"{s['attacks']} attacks on {s['tasks']} tasks: {s['failures']} red-team failures")
    for r in s["results"]:
        mark = "ok" if r["ok"] else f"FAILED: {r['problem']}"
        print(f"  {r['task']} {r['attack']}: {r['score']} | {r['stopped_by'] or '-'} | {r['control'] or '-'} | {mark}")
    return 0 if s["failures"] == 0 else 1

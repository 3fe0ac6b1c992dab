"""`composer-prime env build-tasks <env> --source ... --out DIR`: build an environment's task set.

    composer-prime env build-tasks feature-deletion --source pypi:inflection==0.5.1 --out tasks/inflection
    composer-prime env build-tasks feature-deletion --source ./minilib --out tasks/minilib --seed 1 --max-tasks 5

Progress goes to stderr; the last line on stdout is the task set's directory. Bad input gets one
`error: ...` line and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ENVS = ("feature-deletion",)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("build-tasks", help="build a task set from a source tree (feature-deletion)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("env", choices=ENVS)
    p.add_argument("--source", required=True,
                   help="a project directory, an sdist (.tar.gz/.zip), or pypi:name==version (downloaded with pip, cached)")
    p.add_argument("--out", required=True, type=Path, help="directory to write the task set to")
    p.add_argument("--seed", type=int, default=0, help="seeds the order in which candidates are tried")
    p.add_argument("--max-tasks", type=int, default=None, help="stop once this many tasks are accepted")
    p.add_argument("--variant", choices=("body", "with_helpers"), default="body",
                   help="body: delete one function's body; with_helpers: also remove the private helpers only it uses")
    p.add_argument("--jobs", type=int, default=1, help="candidates checked at the same time")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.set_defaults(func=run)
    return p


def _error(msg: str) -> int:
    print(f"error: {' '.join(str(msg).split())}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if args.max_tasks is not None and args.max_tasks < 1:
        return _error("--max-tasks must be at least 1")
    # The cheap checks first: importing the environment package loads verifiers (seconds).
    if not args.source.startswith("pypi:") and not Path(args.source).expanduser().exists():
        return _error(f"source not found: {args.source}")
    if args.out.is_dir() and any(args.out.iterdir()) and not args.force:
        return _error(f"--out is not empty: {args.out.resolve()} (pass --force to replace it)")
    from feature_deletion.baseline import BuildError
    from feature_deletion.generate import build

    try:
        m = build(args.source, args.out, seed=args.seed, max_tasks=args.max_tasks, variant=args.variant,
                  force=args.force, jobs=args.jobs)
    except BuildError as e:
        return _error(str(e))
    except KeyboardInterrupt:
        print("error: interrupted; no task set was written", file=sys.stderr)
        return 130
    r = m["report"]
    print(f"{r['accepted']} tasks accepted of {r['candidates']} functions; rejected {r['rejected']}; "
          f"{r['seconds']['total']:.1f} s", file=sys.stderr)
    print(Path(args.out).resolve())
    return 0

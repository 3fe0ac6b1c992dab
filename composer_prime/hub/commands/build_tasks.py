"""`composer-prime env build-tasks <env> (--source S | --sources FILE) --out DIR`: build a task set.

    composer-prime env build-tasks feature-deletion --source pypi:inflection==0.5.1 --out tasks/inflection
    composer-prime env build-tasks feature-deletion --source ./minilib --out tasks/minilib --seed 1 --max-tasks 5
    composer-prime env build-tasks feature-deletion --sources projects.txt --out tasks/many --max-tasks 20

`--sources`: one source per line (`pypi:name==version`, a directory or an sdist, then optional
extra requirements for its test environment); built in parallel, resumable, one task index.
Progress goes to stderr (utils/progress.py: candidates or sources checked, and the time left);
the summary goes to stdout, its last line the task set's directory. Bad input gets one
`error: ...` line and exit code 2. The logic lives in the environment package (feature_deletion).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from composer_prime.utils.fs import check_writable_dir
from composer_prime.utils.progress import Progress

ENVS = ("feature-deletion",)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("build-tasks", help="build a task set from source trees (feature-deletion)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("env", choices=ENVS, help="the environment whose tasks to build")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--source", help="a project directory, an sdist (.tar.gz/.zip), or pypi:name==version")
    what.add_argument("--sources", type=Path, help="a file listing sources, one per line")
    p.add_argument("--out", required=True, type=Path, help="directory to write the task set to")
    p.add_argument("--seed", type=int, default=0, help="seeds the order in which candidates are tried")
    p.add_argument("--max-tasks", type=int, default=None, help="stop once this many tasks are accepted (per source)")
    p.add_argument("--variant", choices=("body", "with_helpers"), default="body",
                   help="body: delete one function's body; with_helpers: also remove the private helpers only it uses")
    p.add_argument("--jobs", type=int, default=None,
                   help="cores to use (default: 1 for --source, every core for --sources)")
    p.add_argument("--deps", action="append", default=[], metavar="REQ",
                   help="a requirement to install in the test environment besides the declared ones (repeatable)")
    p.add_argument("--ignore-declared-deps", action="store_true",
                   help="install only pytest, coverage and --deps, not what the project declares")
    p.add_argument("--keep-pytest-config", action="store_true",
                   help="keep the project's addopts and let pytest autoload every installed plugin")
    p.add_argument("--pytest-plugins", default=None, metavar="MOD,MOD",
                   help="the plugins to load with -p (default: those the test environment installs, "
                        "minus the ones that reorder tests)")
    p.add_argument("--retry-failed", action="store_true", help="--sources: build again the sources that failed")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.set_defaults(func=run)
    return p


def _error(msg: str) -> int:
    print(f"error: {' '.join(str(msg).split())}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if args.max_tasks is not None and args.max_tasks < 1:
        return _error("--max-tasks must be at least 1")
    if args.jobs is not None and args.jobs < 1:
        return _error("--jobs must be at least 1")
    try:
        check_writable_dir(args.out)
    except OSError as e:
        return _error(f"--out: {e}")
    if args.source and args.out.is_dir() and any(args.out.iterdir()) and not args.force:
        return _error(f"--out is not empty: {args.out.resolve()} (pass --force to replace it)")
    from feature_deletion.baseline import BuildError, check_source
    from feature_deletion.buildlog import index_lines, summary_lines
    from feature_deletion.candidates import Settings
    from feature_deletion.generate import build
    from feature_deletion.sources import build_many, parse_sources

    plugins = None if args.pytest_plugins is None else [m for m in args.pytest_plugins.split(",") if m]
    settings = Settings(deps=args.deps, declared_deps=not args.ignore_declared_deps,
                        keep_pytest_config=args.keep_pytest_config, pytest_plugins=plugins)
    try:
        if args.source:  # bad input (missing, not an sdist, not on PyPI): one line, before the build log is opened
            check_source(args.source)
        if args.sources:
            sources = parse_sources(args.sources)
            # no live line: the sources build in worker processes, whose lines go straight to this terminal
            with Progress("build-tasks", None, "sources", live=False) as progress:
                index = build_many(sources, args.out, seed=args.seed, max_tasks=args.max_tasks, variant=args.variant,
                                   jobs=args.jobs, settings=settings, force=args.force, retry_failed=args.retry_failed,
                                   log=progress.echo, progress=progress.update)
            lines = index_lines(index)
            if not index["tasks"]:
                print("\n".join(lines))
                return _error(f"no source yielded tasks (logs in {args.out.resolve() / 'sources'})")
        else:
            with Progress("build-tasks", None, "candidates") as progress:
                manifest = build(args.source, args.out, seed=args.seed, max_tasks=args.max_tasks, variant=args.variant,
                                 force=args.force, jobs=args.jobs or 1, settings=settings, log=progress.echo,
                                 progress=progress.update)
            lines = summary_lines(manifest)
    except BuildError as e:
        return _error(str(e))
    except KeyboardInterrupt:
        print("error: interrupted; no task set was written" if args.source else
              "error: interrupted; finished sources are kept, run the same command to resume", file=sys.stderr)
        return 130
    print("\n".join(lines))
    print(Path(args.out).resolve())
    return 0

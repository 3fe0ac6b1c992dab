"""`composer-prime env init NAME [--dir environments]`: scaffold a verifiers v1 environment package."""

from __future__ import annotations

import argparse
from pathlib import Path

from composer_prime.hub.errors import one_line_errors


@one_line_errors
def run(args: argparse.Namespace) -> int:
    from composer_prime.hub.scaffold import scaffold

    root = scaffold(args.name, Path(args.dir), force=args.force)
    print(f"created {root}")
    print(f"next: uv run composer-prime env validate {root}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("init", help="scaffold a verifiers v1 environment package (passes `validate` as is)")
    p.add_argument("name", help="environment name, dash-case (e.g. my-env)")
    p.add_argument("--dir", default="environments", help="parent directory (default: environments)")
    p.add_argument("--force", action="store_true", help="overwrite an existing directory")
    p.set_defaults(func=run)
    return p

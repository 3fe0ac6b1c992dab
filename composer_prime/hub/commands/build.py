"""`composer-prime env build PATH`: wheel + source archive + content hash (prime's file rules and hash)."""

from __future__ import annotations

import argparse
from pathlib import Path

from composer_prime.hub.errors import one_line_errors


@one_line_errors
def run(args: argparse.Namespace) -> int:
    from composer_prime.hub.artifact import MANIFEST, build

    art = build(Path(args.path), Path(args.out) if args.out else None)
    print(f"environment    {art.name} {art.version}  ({art.runtime_hint or 'unclassified'})")
    print(f"content hash   {art.content_hash}")
    print(f"wheel          {art.wheel}  sha256 {art.wheel_sha256}")
    print(f"source archive {art.source}  sha256 {art.source_sha256}  ({len(art.files)} files)")
    print(f"manifest       {art.wheel.parent / MANIFEST}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("build", help="build the hub artifact: wheel, source archive, content hash")
    p.add_argument("path", help="environment directory (with pyproject.toml)")
    p.add_argument("--out", help="output directory (default PATH/dist, which the hash leaves out)")
    p.set_defaults(func=run)
    return p

"""`composer-prime env install owner/name@version`: resolve on the hub (PRIME_BASE_URL), download
the wheel, verify its sha256, `uv pip install` it (into this interpreter, --python or --target)."""

from __future__ import annotations

import argparse
from pathlib import Path

from composer_prime.hub.errors import one_line_errors


@one_line_errors
def run(args: argparse.Namespace) -> int:
    from composer_prime.hub.install import install
    from composer_prime.hub.protocol import HubClient, parse_ref

    ref = parse_ref(args.env)
    with HubClient() as client:
        done = install(ref, client, python=args.python, target=Path(args.target) if args.target else None,
                       no_deps=args.no_deps, expected_sha256=args.sha256, verify=not args.no_verify)
    print(f"installed {ref.owner}/{ref.name}@{done.version} ({done.wheel}) into {done.into}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("install", help="install owner/name@version from the hub")
    p.add_argument("env", help="owner/name[@version] (version defaults to latest)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--python", help="interpreter to install into (default: the one running this command)")
    where.add_argument("--target", help="install into this directory instead (uv pip install --target)")
    p.add_argument("--no-deps", action="store_true", help="do not install the wheel's dependencies")
    p.add_argument("--sha256", help="expected wheel sha256 (default: the hub's wheel_sha256)")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 check")
    p.set_defaults(func=run)
    return p

"""`composer-prime env publish PATH [--owner O] [--yes]`: push to the Environments Hub the way
`prime env push` does. A dry run unless --yes. Honours PRIME_API_KEY and PRIME_BASE_URL."""

from __future__ import annotations

import argparse
from pathlib import Path

from composer_prime.hub.errors import one_line_errors


@one_line_errors
def run(args: argparse.Namespace) -> int:
    from composer_prime.hub.artifact import build
    from composer_prime.hub.protocol import HubClient
    from composer_prime.hub.publish import describe, push

    with HubClient() as client:
        if args.yes:
            client.require_key()  # before spending a build on a push that cannot happen
        art = build(Path(args.path), Path(args.out) if args.out else None)
        if not args.yes:
            print(describe(art, client.base_url, args.owner, bool(client.api_key)))
            return 0
        done = push(art, client, owner=args.owner, visibility=args.visibility)
    print(f"pushed {done.owner}/{done.name}@{done.version} (content hash {art.content_hash[:12]}) to {client.base_url}")
    print(f"install with: composer-prime env install {done.owner}/{done.name}@{done.version}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("publish", help="push an environment to the hub (dry run unless --yes)")
    p.add_argument("path", help="environment directory (with pyproject.toml)")
    p.add_argument("--owner", help="user or team slug to push to (default: the key's account)")
    p.add_argument("--visibility", choices=["PUBLIC", "PRIVATE"], help="visibility when the environment is created")
    p.add_argument("--out", help="where to build (default PATH/dist)")
    p.add_argument("--yes", action="store_true", help="really push (otherwise print what would be pushed)")
    p.set_defaults(func=run)
    return p

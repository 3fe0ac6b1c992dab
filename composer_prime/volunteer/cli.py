"""`composer-prime volunteers invite|list|revoke`: the run operator's invites (volunteer/invites.py).

    composer-prime volunteers invite NAME --run OUTPUT_DIR [--out FILE]   a token for one volunteer
    composer-prime volunteers list --run OUTPUT_DIR                      every invite and its state
    composer-prime volunteers revoke NAME --run OUTPUT_DIR [--why TEXT]  its keys refused from now on

`--run` is the run's `output_dir` (the pool reads `<output_dir>/orchestrator/invites.json`, again
whenever it changes: invites work while the run is going). The token is printed once, or written
to `--out` (mode 0600) for `uv run worker --token_file FILE`; the store keeps only its hash.
`revoke` says what it revoked and, where the run's pool is running, waits for it to eject the
invite's keys (within a few of its beats, read from its roster: volunteer/roster.py) and says which.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from composer_prime.volunteer.invites import InviteError, Invites, store_path
from composer_prime.volunteer.roster import NAME as ROSTER, STALE_BEATS, read_roster
from composer_prime.volunteer.tls import pinned_token


def _invite(args: argparse.Namespace) -> int:
    token = pinned_token(Invites(store_path(args.run)).invite(args.name), args.run)  # the pool's certificate pinned
    if args.out is None:
        print(token)
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never over another invite's token
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    print(args.out)
    return 0


def _list(args: argparse.Namespace) -> int:
    table = Invites(store_path(args.run)).table()
    for name, entry in sorted(table.items()):
        made = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.get("created", 0)))
        print(f"{name}\t{made}\t{'revoked: ' + entry['revoked'] if entry.get('revoked') else 'active'}")
    if not table:
        print(f"no invites in {store_path(args.run)}", file=sys.stderr)
    return 0


def _revoke(args: argparse.Namespace) -> int:
    if not Invites(store_path(args.run)).revoke(args.name, args.why):
        print(f"{args.name} was revoked already", file=sys.stderr)
        return 0
    print(f"revoked {args.name} ({args.why}): {ejected(args.run, args.name)}")
    return 0


def keys(n: int) -> str:
    return f"{n} key" + ("" if n == 1 else "s")


def ejected(run: Path, name: str) -> str:
    """Which keys of invite `name` the running pool ejected, waiting up to a few of its beats for it to."""
    path = store_path(run).with_name(ROSTER)
    if (roster := read_roster(path)) is None:
        return f"no pool is running in {run}; its keys are refused when they join"
    nodes = [m["node"] for m in roster["members"] if m.get("invite") == name and m.get("status") != "ejected"]
    if not nodes:
        return "no key of it is in the running pool"
    deadline = time.time() + STALE_BEATS * roster["heartbeat_s"] + 5.0
    while True:
        now = read_roster(path) or roster
        left = [m["node"] for m in now["members"] if m.get("node") in nodes and m.get("status") != "ejected"]
        if not left:
            return f"{keys(len(nodes))} ejected from the running pool ({', '.join(n[:12] for n in nodes)})"
        if time.time() > deadline:
            return (f"{len(nodes) - len(left)} of its {keys(len(nodes))} ejected; {', '.join(n[:12] for n in left)} "
                    "still in the pool, refused at its next request")
        time.sleep(0.2)


def _run(func):
    def go(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except InviteError as e:
            print(f"error: {e}", file=sys.stderr)
        except FileExistsError:
            print(f"error: --out {args.out} exists (a token is never written over)", file=sys.stderr)
        except OSError as e:
            print(f"error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    return go


def add_parser(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("volunteers", help="invite, list and revoke the volunteers of a run (docs/volunteers.md)")
    actions = v.add_subparsers(dest="volunteers_command", required=True)
    for name, func, helptext in (("invite", _invite, "a join token for one volunteer (printed once, or to --out)"),
                                 ("list", _list, "every invite: name, made, active or revoked (and why)"),
                                 ("revoke", _revoke, "refuse the invite's keys from now on (ejected if in the pool)")):
        a = actions.add_parser(name, help=helptext)
        if name != "list":
            a.add_argument("name", help="the volunteer's name (letters, digits, '.', '_', '-')")
        a.add_argument("--run", type=Path, required=True, help="the run's output_dir, e.g. outputs/quickstart")
        if name == "invite":
            a.add_argument("--out", type=Path, help="write the token to this file (0600) instead of printing it")
        if name == "revoke":
            a.add_argument("--why", default="revoked by the operator", help="the reason the pool gives the node")
        a.set_defaults(func=_run(func))

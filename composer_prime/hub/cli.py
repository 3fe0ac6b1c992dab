"""`composer-prime env <command>`: one module per command under `composer_prime/hub/commands/`.

Each command module defines `add_parser(sub) -> argparse.ArgumentParser` and sets `func` on it
(a function of the parsed args returning an exit code). Listing the module here registers it.
"""

from __future__ import annotations

import argparse
import importlib

COMMANDS: tuple[str, ...] = ("init", "validate", "eval", "build", "publish", "install", "build_tasks", "redteam", "serve")


def add_parser(sub: argparse._SubParsersAction) -> None:
    env = sub.add_parser("env", help="environment tooling: build tasks, scaffold, validate, build, publish, install, serve as OpenEnv")
    env_sub = env.add_subparsers(dest="env_command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"composer_prime.hub.commands.{name}").add_parser(env_sub)

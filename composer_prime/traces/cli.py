"""`composer-prime traces <command>`: one module per command, listed here."""

from __future__ import annotations

import argparse
import importlib

COMMANDS: tuple[str, ...] = ("ingest", "replay", "dataset")


def add_parser(sub: argparse._SubParsersAction) -> None:
    traces = sub.add_parser("traces", help="recorded agent sessions: ingest (then replay by teachers)")
    traces_sub = traces.add_subparsers(dest="traces_command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"composer_prime.traces.{name}").add_parser(traces_sub)

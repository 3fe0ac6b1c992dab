"""One logging set-up for every process: each line reads `[process] message`.

Each entrypoint calls `setup("trainer")` (or its own name) once, before anything logs, and every
module logs through `logging.getLogger(__name__)`; no module prints its own prefix. The prefix
tells processes apart where their lines meet: `rl`'s console, a cluster's collected logs. `rl`
names each process it starts (`inference-1`) through COMPOSER_PRIME_PROCESS, which wins.
Python warnings go through the same handler, so they carry the prefix too.

Our modules speak at INFO; libraries only from WARNING up (httpx's request lines and uvicorn's
access lines would bury ours). A process that would repeat what another says (trainer ranks
other than 0) is `quiet`: warnings and errors only.

Not logs: a command's result (a path, a table) and the one line that ends a failed command.
Those stay plain prints to stdout and stderr, so scripts and tests can read them.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

PROCESS_ENV = "COMPOSER_PRIME_PROCESS"


def setup(process: str, quiet: bool = False, stream: TextIO | None = None) -> None:
    """Route every logger of this process to `stream` (stdout by default) as `[process] message`."""
    handler = logging.StreamHandler(stream or sys.stdout)  # flushes after each line: `rl` tees it live
    name = os.environ.get(PROCESS_ENV, process)
    handler.setFormatter(logging.Formatter(f"[{name}] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("composer_prime").setLevel(logging.WARNING if quiet else logging.INFO)
    logging.captureWarnings(True)

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

from composer_prime.utils import watchdog

PROCESS_ENV = "COMPOSER_PRIME_PROCESS"


class _Console(logging.StreamHandler):
    """A handler writing to whatever sys.stdout (or sys.stderr) is when a line is emitted, not the
    stream of the moment `setup` ran: a process that redirects its output later (a test harness,
    a daemon) keeps its lines instead of writing into a closed stream."""

    def __init__(self, to_stderr: bool) -> None:
        self.to_stderr = to_stderr
        super().__init__()

    @property
    def stream(self) -> TextIO:  # type: ignore[override]
        return sys.stderr if self.to_stderr else sys.stdout

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def setup(process: str, quiet: bool = False, stderr: bool = False, stream: TextIO | None = None) -> None:
    """Route every logger of this process to stdout (stderr with `stderr`, or a given `stream`) as
    `[process] message`. Called again, it replaces what the previous call set up."""
    # transformers' "Loading weights" bars (a blank line and two bars at every load: each audit's copy, each
    # rank's model) went to every process's stderr; it reads this when first imported, so before that
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    handler = logging.StreamHandler(stream) if stream is not None else _Console(stderr)  # flushes after each line
    name = os.environ.get(PROCESS_ENV, process)
    handler.setFormatter(logging.Formatter(f"[{name}] %(message)s"))
    watchdog.install(name)  # stacks on request and progress marks, within `rl` (a no-op elsewhere)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("composer_prime").setLevel(logging.WARNING if quiet else logging.INFO)
    logging.captureWarnings(False)  # a second setup in one process (tests) captures afresh
    logging.captureWarnings(True)

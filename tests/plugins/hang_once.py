"""A fault for the watchdog's test (tests/integration/test_watchdog.py), not a loss: a channel that
never has weights (so it adds nothing to any loss) and, after the optimizer step `HANG_AT`, hangs
the trainer, once: the first time, it leaves the file `HANG_ONCE` behind (the hung process's pid
in it), and a run that finds the file (the resumed one) goes on.

`HANG_IN` says where it hangs:
- `python` (the default): sleeps in Python until the file `HANG_UNTIL` exists (forever, unset): a
  wait that never ends, a lost peer, a lock never released. SIGUSR1 is answered (the watchdog's stacks).
- `native`: in C, holding the GIL, in a wait that a signal does not end: libc's `system` waiting for a
  child `sleep` (glibc retries the wait on EINTR), called through `ctypes.PyDLL`, which keeps the GIL.
  No Python signal handler runs, so SIGUSR1 goes unanswered and only faulthandler's SIGUSR2 dump says
  where the process is (a collective blocked in C++ looks the same). Stopping the run kills the child
  (it is in the trainer's process group): the call returns and the trainer's SIGTERM handler exits."""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

from composer_prime.trainer.loss import Channel


class HangOnce(Channel):
    name = "hang_once"

    def __init__(self, cfg, ctx=None) -> None:
        super().__init__(cfg, ctx)
        self.steps = 0

    def after_step(self) -> None:
        self.steps += 1
        marker = Path(os.environ["HANG_ONCE"])
        if self.steps != int(os.environ["HANG_AT"]) or marker.exists():
            return
        marker.write_text(str(os.getpid()))
        if os.environ.get("HANG_IN", "python") == "native":
            ctypes.PyDLL(None).system(b"exec sleep 3600")  # the native hang
            return
        until = os.environ.get("HANG_UNTIL")
        while not (until and Path(until).exists()):
            time.sleep(0.2)  # the Python hang

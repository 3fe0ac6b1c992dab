"""A fault for the watchdog's test (tests/integration/test_watchdog.py), not a loss: a channel that
never has weights (so it adds nothing to any loss) and, after the optimizer step `HANG_AT`, hangs
the trainer in Python code, once: the first time, it leaves the file `HANG_ONCE` behind, and a run
that finds the file (the resumed one) goes on."""

from __future__ import annotations

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
        if self.steps == int(os.environ["HANG_AT"]) and not marker.exists():
            marker.write_text(str(os.getpid()))
            while True:  # a wait that never ends: a lost peer, a lock never released
                time.sleep(1.0)

"""Progress of a long loop (counts, rate, time left) for a person at a terminal and for a log file.

    with Progress("replay", total=len(steps), unit="states") as progress:
        for chunk in chunks:
            ...
            progress.advance(len(chunk), note=f"{calls} teacher calls")

    for seed in track(seeds, "vs_trl", unit="runs"):   # the same, one item per iteration
        ...

Where it goes depends on its stream (stderr unless given):
- a terminal: one line, redrawn in place (at most every 0.1 s), ended when the loop ends. Lines
  this process logs meanwhile clear it first, and `echo` prints a line above it; other processes
  writing to the same terminal would be glued to it, so their parent passes `live=False`.
- anything else (a log file, a pipe): plain lines through the logging set-up (utils/logs.py),
  one when both `every` items (default: a twentieth of the total) and `interval_s` seconds
  (default 10; COMPOSER_PRIME_PROGRESS_S sets another) have passed since the last, whichever is
  rarer: at most about 20 lines per loop, however fast it runs, and none more often than every 10 s.
The last line (the count reached and the time taken) is always written when the loop ends, also
when it ends early; a loop that raises ends with its error's line instead (the live line cleared
for it). The arithmetic is in plain functions (`eta_seconds`, `render`) so tests pin it.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
INTERVAL_ENV = "COMPOSER_PRIME_PROGRESS_S"
REDRAW_S = 0.1  # a terminal line redrawn faster than this only flickers


def eta_seconds(done: int, total: int | None, elapsed: float) -> float | None:
    """Seconds left at the mean rate so far; None when it cannot be told (no total, nothing done yet)."""
    if total is None or (done <= 0 and total > 0):
        return None
    if done >= total:
        return 0.0
    return elapsed * (total - done) / done


def duration(seconds: float) -> str:
    """`42 s`, `3 min 05 s`, `2 h 07 min`: as precise as a person needs."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def rate(done: int, elapsed: float, unit: str) -> str:
    """Items per second, per minute or per hour: whichever gives a number of at least 1."""
    per_s = done / elapsed
    for scale, per in ((1, "s"), (60, "min"), (3600, "h")):
        if per_s * scale >= 1 or per == "h":
            return f"{per_s * scale:.1f} {unit}/{per}"
    raise AssertionError("unreachable")


def render(label: str, done: int, total: int | None, unit: str, elapsed: float, note: str = "",
           final: bool = False) -> str:
    """One progress line: `label: 12/40 unit (30%) | 1.2 unit/s | 10 s elapsed, ~23 s left | note`."""
    parts = [f"{label}: {done} {unit}" if total is None else
             f"{label}: {done}/{total} {unit} ({100 * done / total if total else 100:.0f}%)"]
    if done > 0 and elapsed > 0:
        parts.append(rate(done, elapsed, unit))
    left = eta_seconds(done, total, elapsed)
    if final:
        parts.append(f"done in {duration(elapsed)}")
    else:
        parts.append(f"{duration(elapsed)} elapsed" + ("" if left is None else f", ~{duration(left)} left"))
    return " | ".join(parts + ([note] if note else []))


class _ClearFirst(logging.Filter):
    """On the root handlers while a terminal line is live: a log line clears it before it is written."""

    def __init__(self, progress: Progress) -> None:
        super().__init__()
        self.progress = progress

    def filter(self, record: logging.LogRecord) -> bool:
        self.progress.clear()
        return True


class Progress:
    """A loop's progress: `advance` (or `update` to absolute counts) as items finish; `close` (or the
    end of a `with` block) writes the last line. `stream`, `clock` and `width` are there for tests."""

    def __init__(self, label: str, total: int | None, unit: str = "items", *, stream: TextIO | None = None,
                 live: bool | None = None, every: int | None = None, interval_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, width: int | None = None) -> None:
        self.label, self.total, self.unit, self.clock, self.width = label, total, unit, clock, width
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.every = every
        self.interval_s = float(os.environ.get(INTERVAL_ENV, 10.0)) if interval_s is None else interval_s
        self.start = self.last_t = clock()
        self.done, self.last_done, self.note = 0, 0, ""
        self.drawn, self.closed = False, False
        self._filter = _ClearFirst(self)
        if self.live:
            for h in logging.getLogger().handlers:
                h.addFilter(self._filter)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.close(failed=kind is not None)

    def advance(self, n: int = 1, note: str | None = None) -> None:
        self.update(self.done + n, note=note)

    def update(self, done: int, total: int | None = None, note: str | None = None) -> None:
        """Absolute counts, for callbacks that report `(done, total)`: a total learnt late is taken here."""
        self.done = done
        self.total = self.total if total is None else total
        self.note = self.note if note is None else note
        now = self.clock()
        if self.live:
            if not self.drawn or now - self.last_t >= REDRAW_S:
                self._draw(self.line(now))
                self.last_t = now
        elif self.total is None or done < self.total:  # the last line is close's
            every = self.every or max(1, math.ceil((self.total or 0) / 20))
            if done - self.last_done >= every and now - self.last_t >= self.interval_s:
                log.info(self.line(now))
                self.last_t, self.last_done = now, done

    def line(self, now: float, final: bool = False) -> str:
        return render(self.label, self.done, self.total, self.unit, now - self.start, self.note, final)

    def echo(self, msg: str, file: TextIO | None = None) -> None:
        """Print a line of the caller's (a build's log line, a run's result) without breaking the live one."""
        self.clear()
        print(msg, file=file or self.stream, flush=True)
        if self.live and not self.closed:
            self._draw(self.line(self.clock()))

    def clear(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.drawn = False

    def close(self, failed: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        final = self.line(self.clock(), final=True)
        if self.live:
            for h in logging.getLogger().handlers:
                h.removeFilter(self._filter)
            if failed:
                self.clear()
                return
            self._draw(final)
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False
        elif not failed:
            log.info(final)

    def _draw(self, line: str) -> None:
        width = self.width or shutil.get_terminal_size().columns
        self.stream.write("\r\x1b[K" + line[:max(1, width - 1)])  # a wrapped line could not be redrawn in place
        self.stream.flush()
        self.drawn = True


def track(items: Iterable[T], label: str, unit: str = "items", total: int | None = None, **kw: object) -> Iterator[T]:
    """`items`, counting each as done when the loop asks for the next; keywords as `Progress`."""
    size = total if total is not None else len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
    with Progress(label, size, unit, **kw) as progress:  # type: ignore[arg-type]
        for item in items:
            yield item
            progress.advance()


class StillWaiting:
    """A wait with no count to show says every `every_s` seconds that it goes on, and since when:
    `waiting for weights v4 (30s; inference serves v3)`. Under `rl` the watchdog names a stall; a
    process started alone (docs/running.md "several machines") has only these lines, so no wait of
    its is silent for longer than `every_s`. A wait that ends sooner says nothing."""

    def __init__(self, what: str, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] | None = None) -> None:
        self.what, self.every_s, self.clock, self.say = what, every_s, clock, say or log.info
        self.start = self.said = clock()

    def tick(self, note: str = "") -> None:
        """Call on every pass of the wait's loop."""
        now = self.clock()
        if now - self.said >= self.every_s:
            self.say(f"waiting for {self.what} ({now - self.start:.0f}s{'; ' + note if note else ''})")
            self.said = now

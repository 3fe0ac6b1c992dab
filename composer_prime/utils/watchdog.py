"""No silent hangs (issue 37): processes say when they advance; `rl` notices when none has.

A run's processes (started by `rl`, utils/supervise.py) find `WATCH_ENV` set to a directory. Each
writes `<name>.progress` whenever it advances (`advanced`: a metrics row, i.e. a trainer step or an
orchestrator batch, and a weight version an inference server loads), and on SIGUSR1 writes
`<name>.stacks`: every thread's stack and, for an event loop, the await chain of every task, with
the frame it is stuck in on the first line (`WHERE ...`), as `<name>-<pid>.stacks`. SIGUSR2 makes
faulthandler dump the C-level view into `<name>-<pid>.faults` (what a process blocked in native
code, a collective say, can still give).

The supervisor's `Watch` reads the progress files. With `step_s` the recent step time (the median
interval between a process's marks, the slowest process's), the run has stalled once no process
advanced for `max(floor_s, factor * step_s)` (before the first step: `startup_s`). Then it asks every
process for its stacks and blames the one that advanced longest ago.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import signal
import statistics
import sys
import sysconfig
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

WATCH_ENV = "COMPOSER_PRIME_WATCH"  # the directory progress marks and stacks go to
LIBRARY = tuple(p for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]} if p)


def _dir() -> Path | None:
    where = os.environ.get(WATCH_ENV)
    return Path(where) if where else None


_me: str | None = None  # this process's name in the run, once `install` ran under `rl`


def advanced(what: str, value: int | None) -> None:
    """This process got to `value` of `what` (a step, a batch, a weight version); a no-op outside `rl`."""
    if (where := _dir()) is None or _me is None:
        return
    tmp = where / f".{_me}-{os.getpid()}.progress.tmp"
    tmp.write_text(json.dumps({"what": what, "value": value, "time": time.time()}))
    os.replace(tmp, where / f"{_me}.progress")


def install(process: str) -> None:
    """Stacks on SIGUSR1 (Python's view, with asyncio tasks), faulthandler's on SIGUSR2; within `rl` only.
    `<process>-<pid>.pid` says this process has both (a trainer's ranks each have theirs): the supervisor
    signals only those, since SIGUSR1 ends a process that does not handle it (vLLM's, torchrun's)."""
    global _me
    if (where := _dir()) is None or threading.current_thread() is not threading.main_thread():
        return
    where.mkdir(parents=True, exist_ok=True)
    _me, me = process, f"{process}-{os.getpid()}"
    signal.signal(signal.SIGUSR1, lambda *_: _write_stacks(where / f"{me}.stacks"))
    faults = open(where / f"{me}.faults", "w")  # noqa: SIM115 - open for the process's life: faulthandler writes to it
    faulthandler.register(signal.SIGUSR2, file=faults, all_threads=True)
    (where / f"{me}.pid").write_text(str(os.getpid()))


def _ours(frame) -> bool:
    return not frame.f_code.co_filename.startswith(LIBRARY) and "watchdog" not in frame.f_code.co_filename


def _where(frames: list) -> str | None:
    """The innermost frame of our code (not the standard library's nor an installed package's)."""
    for f in reversed(frames):
        if _ours(f):
            return f"{Path(f.f_code.co_filename).name}:{f.f_lineno} in {f.f_code.co_name}"
    return None


def _await_chain(task: asyncio.Task) -> list:
    """A task's frames, outermost first, following what each coroutine awaits."""
    frames, coro = [], task.get_coro()
    while coro is not None and getattr(coro, "cr_frame", None) is not None:
        frames.append(coro.cr_frame)
        coro = getattr(coro, "cr_await", None)
    return frames


def _write_stacks(path: Path) -> None:
    lines, places = [], []
    main = threading.main_thread().ident
    for ident, frame in sys._current_frames().items():
        stack = [f for f, _ in traceback.walk_stack(frame)][::-1]
        name = next((t.name for t in threading.enumerate() if t.ident == ident), str(ident))
        lines += [f"thread {name}:", "".join(traceback.format_list(traceback.extract_stack(frame))).rstrip()]
        if ident == main:
            places.append(_where(stack))
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:  # the main thread sits in the loop's select: where each task waits says more
        tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
        for t in tasks:
            chain = _await_chain(t)
            lines += [f"task {t.get_name()}:", *(f"  {_where([f]) or f.f_code.co_name}" for f in chain)]
        places = [p for t in tasks if (p := _where(_await_chain(t)))][:1] or places
    where = next((p for p in places if p), "an unknown place")
    path.write_text("\n".join([f"WHERE {where}", *lines]) + "\n")


@dataclass
class Watch:
    """The supervisor's side: progress files in `where`, the thresholds from `[watchdog]`."""

    where: Path
    factor: float
    floor_s: float
    startup_s: float
    started: float = field(default_factory=time.time)
    marks: dict[str, list[float]] = field(default_factory=dict)  # process -> times it advanced (the recent ones)

    def poll(self) -> None:
        for path in self.where.glob("*.progress"):
            try:
                t = json.loads(path.read_text())["time"]
            except (OSError, ValueError, KeyError):
                continue  # being replaced right now
            seen = self.marks.setdefault(path.stem, [])
            if not seen or t > seen[-1]:
                seen.append(t)
                del seen[:-11]

    def limit_s(self) -> float:
        """How long the run may go without any process advancing."""
        gaps = [statistics.median(b - a for a, b in zip(ts, ts[1:])) for ts in self.marks.values() if len(ts) > 1]
        if not gaps:
            return max(self.startup_s, self.floor_s)
        return max(self.floor_s, self.factor * max(gaps))

    def silent_s(self) -> float:
        last = max((ts[-1] for ts in self.marks.values()), default=self.started)
        return time.time() - max(last, self.started)

    def stalled(self) -> bool:
        self.poll()
        return self.silent_s() > self.limit_s()

    def blame(self, names: list[str]) -> str:
        """The process that advanced longest ago (one that never did, first)."""
        return min(names, key=lambda n: self.marks[n][-1] if n in self.marks else 0.0)


def ask_stacks(where: Path, wait_s: float = 5.0) -> dict[str, str]:
    """Every registered process's stacks, asked for now: {"<name>-<pid>": its WHERE line's place}. A
    process that does not answer within `wait_s` (blocked in native code) gets faulthandler's dump."""
    asked, t0 = {}, time.time()
    for pid_file in where.glob("*.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGUSR1)
            asked[pid_file.stem] = where / f"{pid_file.stem}.stacks"
        except (OSError, ValueError):  # gone
            pid_file.unlink(missing_ok=True)
    got: dict[str, str] = {}
    while len(got) < len(asked) and time.time() - t0 < wait_s:
        for me, path in asked.items():
            if me not in got and path.exists() and path.stat().st_mtime >= t0 - 1:
                first = path.read_text().partition("\n")[0]
                if first.startswith("WHERE "):
                    got[me] = first.removeprefix("WHERE ")
        time.sleep(0.1)
    for me in set(asked) - set(got):
        try:
            os.kill(int((where / f"{me}.pid").read_text()), signal.SIGUSR2)
            got[me] = f"native code (no Python stack answered: see {me}.faults)"
        except (OSError, ValueError):
            pass
    return got


def place(process: str, stacks: dict[str, str]) -> str:
    """Where `process` is stuck, from its stacks (a trainer's: the rank's, not its launcher's wait)."""
    mine = [w for me, w in sorted(stacks.items()) if me.rpartition("-")[0] == process]
    inner = [w for w in mine if "entrypoints" not in w and not w.startswith(("trainer.py", "rl.py"))]
    return (inner or mine or ["an unknown place (it gave no stacks)"])[0]

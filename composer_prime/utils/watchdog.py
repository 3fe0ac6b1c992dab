"""No silent hangs (issues 37, 46), a process's side: it says when it is up and when it advances, and,
asked, where it is and what it waits for. The supervisor's side (the limits, who is blamed) is watch.py.

A run's processes (started by `rl`, utils/supervise.py) find `WATCH_ENV` set to a directory. Each
keeps `<name>.progress` there: when it became ready (`ready`: up, its first batch next), its steps
(`advanced`: a metrics row, i.e. a trainer step or an orchestrator batch, and a weight version an
inference server loads) with the recent gaps between them, and when something last moved inside a
step (`active`: a rollout finished). On SIGUSR1 it writes `<name>-<pid>.stacks`: the place it is
stuck in on the first line (`WHERE ...`; `RUNNING` next when its event loop is blocked in our code,
whose open waits then say nothing), then what it waits for (`WAIT` lines: a peer process, an
environment's reward function, with how long and, for a call that has its own timeout, until when),
then every thread's stack and, for an event loop, the await chain of every task. SIGUSR2 makes
faulthandler dump the C-level view into `<name>-<pid>.faults` (what a process blocked in native
code, a collective say, can still give).

What a process waits for is kept in memory (`waiting`, a dict entry per open wait: microseconds)
and written only when asked, so a step pays nothing for it.
"""

from __future__ import annotations

import asyncio
import faulthandler
import itertools
import json
import os
import signal
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

WATCH_ENV = "COMPOSER_PRIME_WATCH"  # the directory progress marks and stacks go to
LIBRARY = tuple(p for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]} if p)
GAPS_KEPT = 16  # recent step gaps in a progress file: the supervisor keeps the slowest it has seen
ACTIVE_EVERY_S = 1.0  # `active` rewrites the file at most this often (it may be called for every rollout)


def _dir() -> Path | None:
    where = os.environ.get(WATCH_ENV)
    return Path(where) if where else None


_me: str | None = None  # this process's name in the run, once `install` ran under `rl`
_progress: dict = {"ready": None, "steps": 0, "step": None, "active": None, "gaps": [], "time": None}
_last: dict[str, float] = {}  # what -> when it last advanced (a gap is between two marks of the same kind)
_written = [0.0]
_waits: dict[int, tuple[str, str, float, float | None, Callable[[], str | None] | None]] = {}
_ids = itertools.count()


def _write(now: float) -> None:
    if (where := _dir()) is None or _me is None:
        return
    _progress["time"], _written[0] = now, now
    tmp = where / f".{_me}-{os.getpid()}.progress.tmp"
    tmp.write_text(json.dumps(_progress))
    os.replace(tmp, where / f"{_me}.progress")


def ready() -> None:
    """This process is up: its first batch is next (the supervisor's short first-batch limit starts once
    every driving process said so); a no-op outside `rl`, and after the first call."""
    if _progress["ready"] is None:
        _progress["ready"] = time.time()
        _write(_progress["ready"])


def advanced(what: str, value: int | None) -> None:
    """This process got to `value` of `what` (a step, a batch, a weight version); a no-op outside `rl`."""
    now = time.time()
    if what in _last:
        _progress["gaps"] = [*_progress["gaps"], [now, now - _last[what]]][-GAPS_KEPT:]
    _last[what] = now
    _progress["steps"] += 1
    _progress["step"] = now
    _write(now)


def active() -> None:
    """Something moved within a step (a rollout finished): not a step, but not a stall either."""
    now = _progress["active"] = time.time()
    if now - _written[0] >= ACTIVE_EVERY_S:
        _write(now)


@contextmanager
def waiting(on: str, what: str = "", until: float | None = None, where: Callable[[], str | None] | None = None) -> Iterator[None]:
    """While inside, this process waits for `on`: a peer process by its role ("inference", "trainer",
    "orchestrator") or something outside named in words ("my-env's reward function"); `what` says
    which (a batch, a task), `until` when the wait's own timeout ends it, `where` the place it is
    stuck in (asked only when the stacks are written)."""
    if _me is None:
        yield
        return
    key = next(_ids)
    _waits[key] = (on, what, time.time(), until, where)
    try:
        yield
    finally:
        del _waits[key]


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


def ours(frame) -> bool:
    return not frame.f_code.co_filename.startswith(LIBRARY) and "watchdog" not in frame.f_code.co_filename


def place_of(frame) -> str:
    """`dir/file.py:line in function`: the file's directory too, so an environment's `taskset.py` is told apart."""
    path = Path(frame.f_code.co_filename)
    return f"{path.parent.name}/{path.name}:{frame.f_lineno} in {frame.f_code.co_name}"


def _where(frames: list) -> str | None:
    """The innermost frame of our code (not the standard library's nor an installed package's)."""
    for f in reversed(frames):
        if ours(f):
            return f"{Path(f.f_code.co_filename).name}:{f.f_lineno} in {f.f_code.co_name}"
    return None


def await_chain(task: asyncio.Task) -> list:
    """A task's frames, outermost first, following what each coroutine awaits."""
    frames, coro = [], task.get_coro()
    while coro is not None and getattr(coro, "cr_frame", None) is not None:
        frames.append(coro.cr_frame)
        coro = getattr(coro, "cr_await", None)
    return frames


def _running_our_code(stack: list) -> bool:
    """The main thread is inside our code called from the event loop (a callback that blocks it), not idle
    in the loop's select: then its own stack says where it is, not the tasks' await chains."""
    inner = [i for i, f in enumerate(stack) if ours(f)]
    loop = [i for i, f in enumerate(stack) if f"{os.sep}asyncio{os.sep}" in f.f_code.co_filename]
    return bool(inner and loop and inner[-1] > loop[0])


def _wait_lines(now: float) -> list[str]:
    """`WAIT since until on what where`, tab-separated, the oldest wait for each thing waited on."""
    oldest: dict[str, tuple] = {}
    for on, what, since, until, where in list(_waits.values()):
        if on not in oldest or since < oldest[on][2]:
            oldest[on] = (on, what, since, until, where)
    lines = []
    for on, what, since, until, where in sorted(oldest.values(), key=lambda w: w[2]):
        try:
            at = (where() if where else None) or ""
        except Exception:  # noqa: BLE001 - a place we could not read must not cost the rest of the dump
            at = ""
        lines.append("\t".join(["WAIT", f"{since:.3f}", f"{until:.3f}" if until else "-", on, what, at]))
    return lines


def _write_stacks(path: Path) -> None:
    lines, main_place, now = [], None, time.time()
    main = threading.main_thread().ident
    for ident, frame in sys._current_frames().items():
        stack = [f for f, _ in traceback.walk_stack(frame)][::-1]
        name = next((t.name for t in threading.enumerate() if t.ident == ident), str(ident))
        lines += [f"thread {name}:", "".join(traceback.format_list(traceback.extract_stack(frame))).rstrip()]
        if ident == main:
            main_place = (_where(stack), _running_our_code(stack))
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    place, running = (main_place[0], loop is not None and main_place[1]) if main_place else (None, False)
    if loop is not None:
        tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
        for t in tasks:
            chain = await_chain(t)
            lines += [f"task {t.get_name()}:", *(f"  {_where([f]) or f.f_code.co_name}" for f in chain)]
        if not running:  # the main thread sits in the loop's select: where each task waits says more
            place = next((p for t in tasks if (p := _where(await_chain(t)))), place)
    head = [f"WHERE {place or 'an unknown place'}", *(["RUNNING"] if running else []), *_wait_lines(now)]
    path.write_text("\n".join([*head, *lines]) + "\n")

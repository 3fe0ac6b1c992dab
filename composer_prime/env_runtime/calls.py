"""An environment's own code run under a time limit: a reward that never returns is cut, not waited on.

A verifiers reward is the environment author's code: an `async def` that may still block (a
`time.sleep`, a lock, a sandbox that died), which on the caller's event loop would stop everything
with it, and which no task cancellation reaches. So each call runs in a worker thread with an event
loop of its own, and the caller waits for it with a timeout (`call_timeout_s`, counted from the
call). A call past its time is `CallTimeout`, naming the place it is stuck in
(`my_env/taskset.py:41 in reward`: the innermost frame of the environment's package); the caller
drops the rollout and goes on. An awaiting call is cancelled in its loop; a blocked one cannot be,
so its thread is abandoned and another takes its place.

Bounded: at most `MAX_WORKERS` threads run calls at once (scoring is mostly CPU under the GIL: more
threads would only contend; further calls queue), at most `MAX_STUCK` abandoned ones may still be
running (then calls are refused at once, and an environment whose every rollout of a step timed
out stops the run), and an abandoned thread whose call returns at last is used again. Threads are
daemons (an abandoned one never holds up the process's exit); an idle one ends after `IDLE_S`.
While a call runs, the process's watchdog status says it waits on it (utils/watchdog.py).
"""

from __future__ import annotations

import asyncio
import queue
import sys
import sysconfig
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from composer_prime.utils import watchdog

T = TypeVar("T")
MAX_WORKERS = 8  # threads running calls at once, per box
MAX_STUCK = 32  # abandoned threads a box tolerates at once: calls hung past their timeout, still running
IDLE_S = 30.0  # an idle worker ends after this long without a call
STDLIB = sysconfig.get_paths()["stdlib"]
OWN = str(Path(__file__).resolve().parents[1])  # composer_prime's own frames are never the environment's place


def code_of(tasks: list) -> Path | None:
    """The directory of the package the tasks' class comes from: an environment's own code."""
    if not tasks:
        return None
    module = sys.modules.get(type(tasks[0]).__module__.partition(".")[0])
    return Path(module.__file__).parent if module is not None and getattr(module, "__file__", None) else None


class CallTimeout(Exception):
    """A call did not return within its time; `where` is the place it was stuck in."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where


class _Job:
    def __init__(self, make: Callable[[], Awaitable[Any]], deliver: Callable[[bool, Any], None]) -> None:
        self.make, self.deliver = make, deliver
        self.ident: int | None = None  # the worker thread's, once it runs
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task | None = None
        self.given_up = False  # its caller stopped waiting (before it started: it never runs)
        self.finished = False


def _deliver(loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> Callable[[bool, Any], None]:
    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def deliver(ok: bool, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:  # the caller's loop is closed: a call abandoned at the end of the run
            pass

    return deliver


class CallBox:
    """Calls into one environment's code, in worker threads, each cut after `timeout_s`. `code` is the
    environment's package directory: the frames it names when a call hangs."""

    def __init__(self, name: str, timeout_s: float, code: Path | None = None) -> None:
        self.name, self.timeout_s, self.code = name, timeout_s, str(code) if code else None
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live = 0  # workers taking calls (not abandoned)
        self._idle = 0  # of them, waiting for one
        self._queued = 0  # calls put in `_jobs`, not yet taken
        self.stuck = 0  # abandoned calls still running
        self.timeouts = 0

    def _grow(self) -> None:
        """Under the lock: one more worker where more calls queue than workers wait."""
        if self._queued > self._idle and self._live < MAX_WORKERS:
            self._live += 1
            threading.Thread(target=self._work, name=f"calls {self.name}", daemon=True).start()

    def _work(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        while True:
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    self._live -= 1
                break
            with self._lock:
                self._idle -= 1
                self._queued -= 1
                if job.given_up:
                    continue
                job.ident, job.loop = threading.get_ident(), loop
            try:
                job.task = loop.create_task(job.make())
                ok, value = True, loop.run_until_complete(job.task)
            except BaseException as e:  # noqa: BLE001 - the caller's to raise (a cancelled call: nobody waits)
                ok, value = False, e
            job.deliver(ok, value)
            with self._lock:
                job.finished = True
                if not job.given_up:
                    continue
                self.stuck -= 1  # abandoned, and back: a worker again if one is wanted
                if self._live >= MAX_WORKERS:
                    break
                self._live += 1
        loop.close()

    def where(self, job: _Job) -> str:
        """The place `job` is in now: the environment's innermost frame, in its thread (a call that blocks)
        or in its loop's tasks (a call that awaits)."""
        frames = []
        frame = sys._current_frames().get(job.ident) if job.ident else None
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        if job.loop is not None:
            try:
                for task in list(asyncio.all_tasks(job.loop)):
                    frames += reversed(watchdog.await_chain(task))
            except RuntimeError:  # the set changed while read from here: the thread's own frames will do
                pass
        files = [f.f_code.co_filename for f in frames]
        for i, path in enumerate(files):  # innermost first: the environment's own code, else any not ours
            if self.code and path.startswith(self.code):
                return watchdog.place_of(frames[i])
        for i, path in enumerate(files):
            if not path.startswith((STDLIB, OWN)) and "site-packages" not in path:
                return watchdog.place_of(frames[i])
        return "an unknown place" if job.ident else "no place: it waited for a free worker"

    def _give_up(self, job: _Job) -> None:
        """The caller stops waiting: a call not started never runs; a running one is abandoned (its thread
        no longer counts as a worker, and one more starts if calls queue)."""
        with self._lock:
            self.timeouts += 1
            job.given_up = True
            if job.ident is None or job.finished:
                return
            self.stuck += 1
            self._live -= 1
            self._grow()
        if job.loop is not None and job.task is not None:  # an awaiting call ends here; a blocked one cannot
            try:
                job.loop.call_soon_threadsafe(job.task.cancel)
            except RuntimeError:
                pass

    async def call(self, make: Callable[[], Awaitable[T]], what: str, on: str) -> T:
        """`await make()` in a worker thread; CallTimeout after `timeout_s`. `on` names what is called
        (the watchdog's words: "my-env's reward function"), `what` which call (a task)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        job = _Job(make, _deliver(loop, future))
        with self._lock:
            if self.stuck >= MAX_STUCK:
                raise CallTimeout(f"{on}: {self.stuck} calls are still hung past {self.timeout_s:g} s, so no more "
                                  f"are started ({what})", "")
            self._queued += 1
            self._jobs.put(job)
            self._grow()
        with watchdog.waiting(on, what, time.time() + self.timeout_s, lambda: self.where(job)):
            try:
                return await asyncio.wait_for(future, self.timeout_s)
            except asyncio.TimeoutError:
                where = self.where(job)
                self._give_up(job)
                raise CallTimeout(f"{on} did not return in {self.timeout_s:g} s ({what}): stuck in {where}", where) from None

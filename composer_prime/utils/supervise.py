"""Run named processes together: tee their output, stop them all when one fails, hangs or on Ctrl-C.

What `rl` does with inference, trainer, orchestrator and relays. Each process runs in its own
session (so a stop reaches its whole process group: torchrun's ranks, vLLM's server) and dies
with the supervisor. When one fails, the others are stopped quietly (their shutdown output goes
to their logs only), the console ends with the failing process's own last line, named after it,
and the supervisor exits with code 1 (2 where that process exited 2: one line of its own on bad input,
an environment every rollout of which timed out). When none has advanced for too long (utils/watch.py),
every process writes its stacks, one line names the process that stopped and where (or the call it
waits on), and the run stops the same way (or, told to wait, goes on waiting).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from composer_prime.utils.logs import PROCESS_ENV
from composer_prime.utils import prefork
from composer_prime.utils.watch import GRACE_S, Watch, diagnose
from composer_prime.utils.watchdog import WATCH_ENV

log = logging.getLogger(__name__)
Proc = subprocess.Popen | prefork.Forked


class Console:
    """Tees each process's output to its log and, until the stop begins, to the console."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.failed: str | None = None  # the one process whose output stays on the console during the stop
        self.last: dict[str, deque[str]] = {}
        self.threads: dict[str, threading.Thread] = {}

    def attach(self, name: str, proc: Proc, log_path: Path) -> None:
        self.last[name] = deque(maxlen=1)
        self.threads[name] = threading.Thread(target=self._pump, args=(name, proc, log_path), daemon=True)
        self.threads[name].start()

    def _pump(self, name: str, proc: Proc, log_path: Path) -> None:
        with log_path.open("a") as log:
            for line in proc.stdout:  # type: ignore[union-attr]
                log.write(line)
                log.flush()
                if line.strip():
                    self.last[name].append(line.strip().removeprefix(f"[{name}]").strip())
                if self.stopping.is_set() and name != self.failed:
                    continue
                sys.stdout.write(line if line.startswith(f"[{name}]") else f"[{name}] {line}")
                sys.stdout.flush()

    def last_line(self, name: str) -> str:
        """The last line `name` printed (its output drained: `stop` waits for that)."""
        return self.last[name][-1] if self.last[name] else "(it printed nothing)"

    def drain(self, wait_s: float = 10.0) -> None:
        """Wait until every process's output, to its end of file, is in its log: a process that exited can
        still have its last lines (a shutdown traceback) in the pipe, which `rl` would otherwise leave unread."""
        deadline = time.time() + wait_s
        for thread in self.threads.values():
            thread.join(max(0.0, deadline - time.time()))


def stop(procs: dict[str, Proc], console: Console, grace_s: float = 45.0) -> None:  # > vLLM's own 30 s
    for p in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            with contextlib.suppress(ProcessLookupError):  # a stopped process (SIGSTOP, Ctrl-Z) acts on SIGTERM once it runs
                os.killpg(p.pid, signal.SIGCONT)
    deadline = time.time() + grace_s
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    console.drain()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _fail(console: Console, procs: dict[str, Proc], name: str, why: str, log_path: Path) -> None:
    console.failed = name
    console.stopping.set()
    log.warning(f"{name} {why}; stopping the others (log: {log_path})")
    stop(procs, console)
    code = procs[name].returncode
    died = f"killed by {_signal_name(-code)}; its last line: " if code < 0 else ""
    print(f"{name}: {died}{console.last_line(name)}", file=sys.stderr, flush=True)
    raise SystemExit(2 if code == 2 else 1)  # 2: its own one-line verdict on what it was given (an environment)


def _stalled(console: Console, procs: dict[str, Proc], finish: set[str], watch: Watch, wait: bool) -> None:
    """No process advanced within the limit: stacks from all, one line naming the innermost cause
    (utils/watch.py `diagnose`): a process stopped or stuck, or the outside call one waits on. A call
    with its own timeout is said and left to it; otherwise the run stops (or, told to wait, waits on)."""
    silent, limit, words = watch.silent_s(), watch.limit_s(), watch.limit_words()
    live = {n: p.pid for n, p in procs.items() if p.poll() is None}  # one that finished is no suspect
    verdict = diagnose(watch, live, [n for n in live if n in finish])
    bounded = verdict.until is not None and verdict.until > time.time()  # a call its own timeout will end
    ends = f" (its own timeout ends it in {verdict.until - time.time():.0f} s)" if bounded else ""
    line = (f"no process advanced for {silent:.0f} s (the limit: {limit:.0f} s, {words}); {verdict.cause}{ends}; "
            f"every process's stacks: {watch.where}/*.stacks")
    with (watch.where.parent / "watchdog.log").open("a") as f:  # the run's record of it, beside each process's log
        f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
    if bounded:
        log.warning(line)
        watch.hush(verdict.until + GRACE_S)
        return
    if wait:
        log.warning(f"{line}; waiting on (watchdog.on_stall = wait)")
        watch.hush(time.time())  # said once per limit, not every half second
        return
    console.failed = verdict.blamed
    console.stopping.set()
    log.warning(f"{line}; stopping the run (continue it with --resume)")
    stop(procs, console)
    print(f"error: {line}; stopped (continue with --resume)", file=sys.stderr, flush=True)
    raise SystemExit(1)


def supervise(commands: dict[str, list[str]], logs: Path, finish: set[str], env: dict[str, str],
              watch: Watch | None = None, wait: bool = False) -> None:
    """Start every command; return once every process in `finish` has exited 0 (the others, servers,
    are then stopped). Any other exit, a stall `watch` sees (unless told to `wait`), Ctrl-C or SIGTERM
    stops everything and raises SystemExit."""
    if watch is not None:
        watch.where.mkdir(parents=True, exist_ok=True)
        for old in [*watch.where.glob("*.pid"), *watch.where.glob("*.progress")]:  # a resumed run's, long gone
            old.unlink()  # (its stacks stay: each file is named by its process's pid)
        env = {**env, WATCH_ENV: str(watch.where)}
    logs.mkdir(parents=True, exist_ok=True)
    procs: dict[str, Proc] = {}
    console = Console()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        for name, cmd in commands.items():  # all started before the console's threads: prefork forks only a single thread
            procs[name] = prefork.start(cmd, {**env, PROCESS_ENV: name}, close=[p.stdout.fileno() for p in procs.values()])
        for name, proc in procs.items():
            console.attach(name, proc, logs / f"{name}.log")
        while True:
            time.sleep(0.5)
            if failed := [n for n, p in procs.items() if p.poll() not in (None, 0)]:
                _fail(console, procs, failed[0], f"exited with code {procs[failed[0]].returncode}",
                      logs / f"{failed[0]}.log")
            if all(procs[n].poll() == 0 for n in finish):
                break
            if servers := [n for n in procs if n not in finish and procs[n].poll() == 0]:
                _fail(console, procs, servers[0], "exited unexpectedly", logs / f"{servers[0]}.log")
            if watch is not None and watch.stalled():
                _stalled(console, procs, finish, watch, wait)
    except KeyboardInterrupt:
        console.stopping.set()
        log.warning("interrupted; stopping all processes")
        stop(procs, console)
        raise SystemExit(130) from None
    stop(procs, console)

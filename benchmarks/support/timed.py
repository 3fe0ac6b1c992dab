"""Run a benchmarked command for a wall-clock budget, watching its process tree's peak memory, in all
and per process of an `rl` run (each named by the COMPOSER_PRIME_PROCESS its launcher gives it and
its own children, such as vLLM's engine, inherit). `Running` is one such command, polled, so that
several run side by side (support/runs.py); `run_timed` waits for one."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx

from composer_prime.utils.logs import PROCESS_ENV
from composer_prime.utils.proc import die_with_parent

FORKED = re.compile(r"-m composer_prime\.entrypoints\.\w+ @ \S*/configs/([^/\s]+)\.toml")


def process_name(pid: int) -> str:
    """The name `rl` gave this process, "" if none or gone: the config it runs (`-m composer_prime.entrypoints.X @
    <output_dir>/configs/<name>.toml`, which a process `rl` forked shows as its command line while its /proc
    environ stays `rl`'s own: utils/prefork.py), else its PROCESS_ENV (what its own children inherit: vLLM's engine)."""
    try:
        if named := FORKED.search((Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()):
            return named.group(1)
        for item in (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0"):
            if item.startswith(f"{PROCESS_ENV}=".encode()):
                return item.split(b"=", 1)[1].decode()
    except (OSError, UnicodeDecodeError):
        pass
    return ""


def tree_rss(root_pid: int) -> dict[str, int]:
    """Resident bytes of a process and all its descendants (from /proc), summed by process name."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(stat[1]), []).append(int(d.name))
            rss[int(d.name)] = int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            pass
    by_name: dict[str, int] = {}
    todo = [root_pid]
    while todo:
        pid = todo.pop()
        name = process_name(pid)
        by_name[name] = by_name.get(name, 0) + rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return by_name


class Watch(threading.Thread):
    """Every half second the peak RSS of the run's process tree (`peak`) and each named process's own peak
    (`peaks`); every tenth of a second the last answer of `probe` (a 2-step run can load its last weights
    and stop within half a second: at that rate its /health was once last read before any load)."""

    def __init__(self, pid: int, probe=None) -> None:
        super().__init__(daemon=True)
        self.pid, self.probe, self.peak, self.peaks, self.last, self.done = pid, probe, 0, {}, {}, threading.Event()

    def run(self) -> None:
        tick = 0
        while not self.done.wait(0.1):
            tick += 1
            if tick % 5 == 0:
                by_name = tree_rss(self.pid)
                self.peak = max(self.peak, sum(by_name.values()))
                self.peaks = {n: max(self.peaks.get(n, 0), by_name.get(n, 0)) for n in {*self.peaks, *by_name}}
            if self.probe is not None:
                try:
                    self.last = self.probe()
                except (httpx.HTTPError, ValueError):
                    pass  # not up yet, or already stopping


class Running:
    """One command started now, in a session of its own (so that a stop reaches everything it started)
    with its output to `log` and its memory watched; past `budget` seconds of wall time (None: no
    budget) it is stopped with SIGTERM (SIGINT is ignored by jobs a shell put in the background),
    and SIGKILLed 90 s later. `poll` says when it is over, without blocking: several run side by side."""

    def __init__(self, cmd: list[str], cwd: Path, budget: float | None, log: Path, probe=None,
                 env: dict[str, str] | None = None) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.cmd, self.log, self.budget = cmd, log, budget
        self.end: float | None = None
        self.returncode: int | None = None
        self.stopped_at: float | None = None  # when the budget ran out (or `stop` was called)
        with log.open("w") as f:
            self.start = time.time()
            self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **env} if env else None,
                                         preexec_fn=die_with_parent(signal.SIGTERM))  # nothing outlives an interrupted benchmark
        self.watch = Watch(self.proc.pid, probe)
        self.watch.start()

    @property
    def budget_ran_out(self) -> bool:
        return self.stopped_at is not None

    def stop(self) -> None:
        if self.stopped_at is None and self.proc.poll() is None:
            self.stopped_at = time.time()
            self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:  # the whole group ended in between
            pass

    def poll(self) -> bool:
        """True once the process has exited (then `end` and `returncode` are set)."""
        if self.end is not None:
            return True
        now = time.time()
        if self.proc.poll() is None:
            if self.budget is not None and now - self.start >= self.budget:
                self.stop()
            elif self.stopped_at is not None and now - self.stopped_at > 90:
                self._signal(signal.SIGKILL)
            return False
        self.end, self.returncode = now, self.proc.returncode
        self.watch.done.set()
        self.watch.join()
        return True


def run_timed(cmd: list[str], cwd: Path, budget: float, log: Path, probe=None) -> tuple[float, int, dict, dict[str, int]]:
    """Run `cmd` for at most `budget` seconds (a Running); returns (start time, peak RSS, last answer
    of `probe`, peak RSS per process name). Ending before the budget, it must have succeeded."""
    run = Running(cmd, cwd, budget, log, probe)
    while not run.poll():
        time.sleep(0.2)
    if not run.budget_ran_out and run.returncode != 0:  # ended before the budget: it must have finished its steps
        raise SystemExit(f"{' '.join(cmd[:5])} failed with exit code {run.returncode} (log: {log})")
    return run.start, run.watch.peak, run.watch.last, run.watch.peaks

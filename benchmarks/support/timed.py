"""Run a benchmarked command for a wall-clock budget, watching its process tree's peak memory."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx

from composer_prime.utils.proc import die_with_parent


def tree_rss(root_pid: int) -> int:
    """Resident bytes of a process and all its descendants (from /proc)."""
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
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


class Watch(threading.Thread):
    """Every half second: the peak RSS of the run's process tree and the last answer of `probe`."""

    def __init__(self, pid: int, probe=None) -> None:
        super().__init__(daemon=True)
        self.pid, self.probe, self.peak, self.last, self.done = pid, probe, 0, {}, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.peak = max(self.peak, tree_rss(self.pid))
            if self.probe is not None:
                try:
                    self.last = self.probe()
                except (httpx.HTTPError, ValueError):
                    pass  # not up yet, or already stopping


def run_timed(cmd: list[str], cwd: Path, budget: float, log: Path, probe=None) -> tuple[float, int, dict]:
    """Run `cmd` for at most `budget` seconds (then SIGTERM: SIGINT is ignored by jobs a shell put in the
    background); returns (start time, peak RSS, last answer of `probe`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        start = time.time()
        p = subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=die_with_parent(signal.SIGTERM))  # nothing outlives an interrupted benchmark
        watch = Watch(p.pid, probe)
        watch.start()
        try:
            if p.wait(timeout=budget) != 0:  # ended before the budget: it must have finished its steps
                raise SystemExit(f"{' '.join(cmd[:5])} failed with exit code {p.returncode} (log: {log})")
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        watch.done.set()
        watch.join()
    return start, watch.peak, watch.last

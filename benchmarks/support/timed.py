"""Run a benchmarked command for a wall-clock budget, watching its process tree's peak memory, in all
and per process of an `rl` run (each named by the COMPOSER_PRIME_PROCESS its launcher gives it and
its own children, such as vLLM's engine, inherit)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx

from composer_prime.utils.logs import PROCESS_ENV
from composer_prime.utils.proc import die_with_parent


def process_name(pid: int) -> str:
    """The name `rl` gave this process (its PROCESS_ENV), "" if none or gone."""
    try:
        for item in (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0"):
            if item.startswith(f"{PROCESS_ENV}=".encode()):
                return item.split(b"=", 1)[1].decode()
    except OSError:
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
    """Every half second: the peak RSS of the run's process tree (`peak`), each named process's own
    peak (`peaks`), and the last answer of `probe`."""

    def __init__(self, pid: int, probe=None) -> None:
        super().__init__(daemon=True)
        self.pid, self.probe, self.peak, self.peaks, self.last, self.done = pid, probe, 0, {}, {}, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            by_name = tree_rss(self.pid)
            self.peak = max(self.peak, sum(by_name.values()))
            self.peaks = {n: max(self.peaks.get(n, 0), by_name.get(n, 0)) for n in {*self.peaks, *by_name}}
            if self.probe is not None:
                try:
                    self.last = self.probe()
                except (httpx.HTTPError, ValueError):
                    pass  # not up yet, or already stopping


def run_timed(cmd: list[str], cwd: Path, budget: float, log: Path, probe=None) -> tuple[float, int, dict, dict[str, int]]:
    """Run `cmd` for at most `budget` seconds (then SIGTERM: SIGINT is ignored by jobs a shell put in the
    background); returns (start time, peak RSS, last answer of `probe`, peak RSS per process name)."""
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
    return start, watch.peak, watch.last, watch.peaks

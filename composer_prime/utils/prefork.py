"""Start `rl`'s own processes by forking one parent that has imported what they all need, once.

Each process of a run imports torch and transformers, and the orchestrator verifiers too, before doing
anything: alone, an inference server spends 4.1 s of CPU on it, a trainer 4.1 s and an orchestrator 6.9 s,
15.1 s in all, where importing the three sets together costs 7.3 s (2-core CPU, 2026-11-28). A 2-step
quickstart is 19 s of CPU. So `rl` imports each entrypoint's `PRELOAD` modules itself (`preload`) and
starts each of its processes as a fork of itself (`start`): the child is what
`python -m composer_prime.entrypoints.X @ its.toml` would have been (its environment, its command line in
`ps`, a session of its own, death with its parent, stdout and stderr into one pipe, unbuffered, Python's
own signal handlers) with the modules already there. The pages they share stay shared (copy on write).
Two things differ: /proc/<pid>/environ is what the kernel recorded at exec, `rl`'s (the child's own
environment is what it reads and passes on; benchmarks name a forked process by its command line); and
every child ends as `proc.run_main` ends a process (its threads joined, its atexit handlers run: vLLM's
stop among them), inference too, whose `python -m` end is the interpreter's ordinary one.

A fork copies only the thread that calls it: a lock another thread held would stay locked in the child
forever. So a process is forked only while this one runs a single thread, native ones included (an
OpenMP pool, a tokenizer's), and only on Linux, for a command `python -m M ...` whose `M` is imported;
anything else (vLLM's server, a test's script) starts as `subprocess.Popen` did before. Nor where there is an
NVIDIA device: the config's device checks ask torch whether CUDA is there, and that call alone leaves a forked
child unable to use CUDA ("Cannot re-initialize CUDA in forked subprocess"); a GPU machine has the cores anyway.
"""

from __future__ import annotations

import gc
import importlib
import io
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterable
from typing import IO

from composer_prime.utils.proc import die_with_parent, has_gpu, run_main


class Forked:
    """A forked child, with the part of `subprocess.Popen` that utils/supervise.py uses."""

    def __init__(self, pid: int, stdout: IO[str]) -> None:
        self.pid, self.stdout, self.returncode = pid, stdout, None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)  # -N: killed by signal N, as Popen says
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout)  # type: ignore[arg-type]
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]


def preload(entrypoints: Iterable[str]) -> None:
    """Import what each entrypoint module's process would import first (its `PRELOAD`), here, once.
    The environment the children get is already this one's (OMP_NUM_THREADS above all: read when torch loads).
    Nothing where nothing will be forked (`forkable`): each process imports its own there, in parallel."""
    if not sys.platform.startswith("linux") or has_gpu():
        return
    for name in entrypoints:
        module = importlib.import_module(name)
        for heavy in getattr(module, "PRELOAD", ()):
            importlib.import_module(heavy)
    # What was imported lives as long as every child: out of the collector's reach before the forks (as gc.freeze's
    # documentation advises), so no child's full collection walks those ~680,000 objects again (0.35 s of CPU each)
    # nor writes their headers, which copied every page of them into each child
    gc.collect()
    gc.freeze()


def single_threaded() -> bool:
    return len(os.listdir("/proc/self/task")) == 1


def forkable(cmd: list[str]) -> bool:
    return (sys.platform.startswith("linux") and not has_gpu() and len(cmd) >= 3 and cmd[:2] == [sys.executable, "-m"]
            and hasattr(sys.modules.get(cmd[2]), "main") and single_threaded())


def start(cmd: list[str], env: dict[str, str], close: Iterable[int] = ()) -> subprocess.Popen | Forked:
    """`cmd` running in a session of its own that dies with this process, stdout and stderr in one pipe
    (text). Forked where `forkable`; `close`: this process's descriptors the child must not hold (the read
    ends of the children started before it)."""
    if not forkable(cmd):
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True, preexec_fn=die_with_parent())
    preexec = die_with_parent()
    flush_stdio()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (read, *close):
                os.close(fd)
            os.setsid()
            if preexec is not None:
                preexec()
            become(cmd, env, (0, write, write))
        except BaseException:  # noqa: BLE001 - nothing may return into the parent's code from here
            traceback.print_exc()
        os._exit(1)
    os.close(write)
    return Forked(pid, io.open(read, "r", errors="backslashreplace"))


def flush_stdio() -> None:
    """Before a fork: else what this process had buffered would be written again by the child."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()


def become(cmd: list[str], env: dict[str, str], stdio: tuple[int, int, int]) -> None:
    """In a forked child: turn into `cmd` (`python -m M ...`, M imported) as a fresh interpreter would start it in
    the working directory, with `stdio` as its descriptors 0, 1 and 2 (closed here unless they are those), then
    run it; never returns."""
    for target, fd in enumerate(stdio):
        if fd != target:
            os.dup2(fd, target)
    for fd in set(stdio) - {0, 1, 2}:
        os.close(fd)
    for name, fd, errors in (("stdout", 1, "strict"), ("stderr", 2, "backslashreplace")):  # as python -u makes them
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=getattr(sys, name).encoding,
                                  errors=errors, write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    for sig in signal.valid_signals():  # the parent's handlers (rl's SIGTERM) are not the child's
        handler = signal.getsignal(sig)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _retitle(cmd)  # first: setproctitle finds the room for a title only while the environment is the original
    os.environ.clear()
    os.environ.update(env)
    sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
    module = sys.modules[cmd[2]]
    sys.argv = [module.__file__ or cmd[2], *cmd[3:]]
    run_main(module.main)


def _retitle(cmd: list[str]) -> None:
    """`ps` and `pgrep -f` see the command the child stands for, not `rl`'s."""
    import setproctitle

    setproctitle.setproctitle(" ".join(cmd))

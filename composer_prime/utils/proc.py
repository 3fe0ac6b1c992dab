"""Child processes that cannot outlive their parent; the cores and GPUs they may use; the heap a
serving process builds at start; a finished process's quick end."""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import signal
import sys
import threading
import time
from pathlib import Path
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Callable, NoReturn

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` asking Linux to send `sig` to the child when its parent dies.

    Our launchers stop their children's process groups themselves; this is the backstop for
    when the parent is SIGKILLed (OOM killer, `kill -9`) and gets no chance to. Not available
    off Linux (returns None, which Popen accepts)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def preexec() -> None:
        _deathsig(sig)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec


def exit_with_parent(sig: int = signal.SIGTERM) -> None:
    """The same backstop for this process, started by a launcher that is not ours: torchrun starts
    each rank in a session of its own, out of reach of a stop of torchrun's process group, so a
    SIGKILLed torchrun would leave its ranks running. No-op off Linux."""
    if sys.platform.startswith("linux"):
        _deathsig(sig)


def _deathsig(sig: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def pin_cpus(cpus: list[int], who: str) -> None:
    """Pin this process (and the children it starts) to `cpus`; empty means no pinning.

    On a small machine the inference server and the trainer otherwise take turns on every
    core; pinning gives each its own, so generation and training really overlap."""
    if not cpus:
        return
    try:
        check_cpus(cpus)
    except ValueError as e:
        raise SystemExit(f"{who}: {e}") from None
    os.sched_setaffinity(0, set(cpus))


def check_cpus(cpus: list[int]) -> None:
    """Raise ValueError unless this process may run on every core in `cpus`."""
    available = os.sched_getaffinity(0)
    if missing := sorted(set(cpus) - available):
        raise ValueError(f"cpus {missing} are not available here (this process may use {sorted(available)})")


def has_gpu() -> bool:
    """An NVIDIA device node, without importing torch (the launcher stays light)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


@contextmanager
def long_lived() -> Iterator[None]:
    """Within it, the objects made before it (torch's, transformers' and the environments' modules, the
    tokenizer, the tasks: some 700,000 in the orchestrator) are left out of garbage collection. They
    live as long as the process anyway, and every full collection walked them all: 0.33 s, once every
    10 or so steps, 40% of the orchestrator's time with an engine that costs nothing (2-core CPU).
    Leaving it puts them back, so that the process ends as it would have."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()



def run_main(main: Callable[[], object]) -> NoReturn:
    """A process's entry (`python -m composer_prime.entrypoints.X`, as `rl` starts its processes and the
    tests start the tools): `main()`, then `exit_now` with the exit code `main` gave (a `SystemExit`'s,
    whose message is printed as Python would). An exception other than SystemExit propagates: the
    interpreter reports it and ends as usual. Servers stopped by a signal (inference, whose vLLM engine
    ends its own children at teardown; relay, lighthouse, worker) keep the ordinary end."""
    try:
        main()
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    exit_now(code)


STOPPED_JOIN_S = 5.0


def exit_now(code: int = 0) -> NoReturn:
    """End a finished process without the interpreter's teardown.

    A finished orchestrator spent 7 s, and a trainer 3 s, freeing their heaps after their last line
    (py-spy: no Python frame left; 2-core CPU under load, 2026-11-28), and `rl` waits for both at the end
    of every run; any process that imported torch and transformers spends about 1.2 s of CPU on it. What
    that teardown does that matters is done here first: the other non-daemon threads are joined, as the
    interpreter would, the atexit handlers run (logging's flush, weakref finalizers among them), and the
    standard streams are flushed.

    A process stopped by a signal (code 128 + its number: `rl` stopping it, Ctrl-C) waits for those threads
    `STOPPED_JOIN_S` at most: a library's thread blocked on a peer that is gone would hold the stop for as
    long as its own timeout (torchft's quorum thread, its lighthouse stopped first: 45 s, until `rl`'s
    SIGKILL, in test_rl_diloco)."""
    me = threading.current_thread()
    deadline = time.monotonic() + STOPPED_JOIN_S if code >= 128 else None
    for t in threading.enumerate():
        if t is not me and not t.daemon:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):  # closed, or a pipe whose reader is gone: nothing more to say there
            stream.flush()
    os._exit(code)

"""Child processes that cannot outlive their parent; the cores and GPUs they may use."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path
from typing import Callable

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

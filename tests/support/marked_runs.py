"""An `rl` run on vLLM whose every process can be found afterwards (test_rl_vllm.py, test_rl_smollm2.py): the
run is exec'd (not forked by tests/support/forkserver.py) with a marker in its environment, which every process
it starts inherits, vLLM's own included, so a process left behind is found by its `/proc/<pid>/environ`; and
the two ports it listens on (ours, and vLLM's own server 1000 above it) are checked free once it has gone."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from composer_prime.utils.net import bind_error
from tests.conftest import free_port

MARK = "COMPOSER_PRIME_TEST_RUN"


def vllm_port() -> int:
    """A free port for our inference server whose vLLM server's port (1000 above it) is free too."""
    port = free_port()
    while bind_error("127.0.0.1", port + 1000) is not None:
        port = free_port()
    return port


def marked_env(tag: str, **extra: str) -> dict[str, str]:
    """This process's environment with the marker `tag` (and `extra`): what the run's processes inherit."""
    return {**os.environ, MARK: tag, **extra}


def run_processes(tag: str) -> list[int]:
    """Pids of every live process that inherited our marker, children of children included."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if f"{MARK}={tag}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                    state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        pids.append(int(proc.name))
            except OSError:
                pass  # exited meanwhile, or not ours
    return pids


def wait_gone(tag: str, timeout: float) -> list[int]:
    """The marked processes still alive after waiting up to `timeout` s for them to end ([] once all have)."""
    deadline = time.time() + timeout
    while (left := run_processes(tag)) and time.time() < deadline:
        time.sleep(0.5)
    return left


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def left_behind(left: list[int]) -> list[bytes]:
    """The command lines of the processes in `left`: a failed assertion's message."""
    out = []
    for pid in left:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes()[:200])
        except OSError:
            pass
    return out

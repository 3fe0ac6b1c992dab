"""The tests' `python -m composer_prime.entrypoints.X ...` processes, forked from one that imported their modules once.

Why: a test that starts `rl` pays about 6 s of CPU importing torch, transformers and verifiers before anything
runs, a directly started inference server or trainer about 4; the suite starts well over a hundred of them. A
2-step quickstart costs 10.0 s of CPU exec'd and 4.6 s served (three runs each, `OMP_NUM_THREADS=1` as the
tests set it, 2-core CPU, 2026-11-28). `rl` itself forks its processes from what it imported (utils/prefork.py); this
does the same one level up. Each pytest worker starts one fork server (`python -m tests.support.forkserver`:
`prefork.preload` of every heavy entrypoint, then a loop on a Unix socket in a private directory), on
first use. `Popen` and `run` are drop-ins for subprocess's: for a command this serves, the server forks a
watcher, the watcher forks the child, which becomes the command (`prefork.become`: the descriptors,
working directory, environment, command line in `ps`, signal handlers and `sys.argv` a fresh interpreter
would have), and the watcher reports its pid and then its exit status back over the socket.

What a test then sees differently from an exec'd process: the child's parent is the watcher, not the test
(`os.waitpid` is the socket's job; `send_signal`, `kill`, `os.killpg` on a `start_new_session` child work as
before); stdout and stderr are written through, as `python -u` writes them. Served: `HEAVY` entrypoints,
on Linux without an NVIDIA device, and only where the child's environment agrees with the server's on
what is read at import (`IMPORT_TIME`: a test's `PYTHONPATH` plugin, its own HF cache); anything else,
and `uv run ...` (the README's commands are tested as typed), is exec'd by subprocess as always.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

from composer_prime.utils import prefork
from composer_prime.utils.proc import has_gpu

HEAVY = tuple(f"composer_prime.entrypoints.{name}" for name in
              ("rl", "inference", "trainer", "orchestrator", "sft", "worker", "relay", "cli"))
# read when the modules are imported, so a child must agree with the server on them to be served
IMPORT_TIME = ("PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONSAFEPATH", "PYTHONWARNINGS", "HF_HOME",
               "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TRANSFORMERS_CACHE", "XDG_CACHE_HOME",
               "TORCH_HOME", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "LD_LIBRARY_PATH")
# the environment the tests begin with (tests/conftest.py's), not whatever a test had set when one first asked:
# an in-process test's logs.setup adds HF_HUB_DISABLE_PROGRESS_BARS, a monkeypatched HF_HOME comes and goes
BASELINE = dict(os.environ)
READY = b"ready\n"
PARENT_POLL_S = 1.0  # how often an idle server checks that the worker that started it still runs
LOG = "COMPOSER_PRIME_TESTS_FORKLOG"  # a file: a line per command of HEAVY's, served or exec'd (to see which)
OFF = "COMPOSER_PRIME_TESTS_EXEC"  # =1: every command exec'd, as before the server (to compare, or to debug)


def _import_time(env: dict[str, str]) -> dict[str, str | None]:
    return {name: env.get(name) for name in IMPORT_TIME}


class _Server:
    """This process's fork server, started on first use and stopped with this process."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="composer-prime-forkserver-"))  # 0700: only this user connects
        self.path = str(self.dir / "socket")
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.forkserver", self.path], cwd=root,
                                     env=BASELINE, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        # not die_with_parent: Linux's parent-death signal follows the *thread* that forked, and a test's first request
        # may come from a thread (asyncio.to_thread) that ends soon after: the server polls for its process instead
        self.ok = self.proc.stdout.readline() == READY  # type: ignore[union-attr]
        self.env = _import_time(BASELINE)
        atexit.register(self.proc.kill)

    def serves(self, env: dict[str, str]) -> bool:
        return self.ok and self.proc.poll() is None and _import_time(env) == self.env


_server: _Server | None = None
served: list[list[str]] = []  # the commands this process had forked, in order (test_forkserver reads it)
_server_lock = threading.Lock()


def _served(args: object, env: dict[str, str] | None) -> _Server | None:
    global _server
    if not (isinstance(args, list) and len(args) >= 3 and args[:2] == [sys.executable, "-m"] and args[2] in HEAVY
            and sys.platform.startswith("linux") and not has_gpu() and os.environ.get(OFF) != "1"):
        return None
    with _server_lock:
        if _server is None:
            _server = _Server()
    server = _server if _server.serves(dict(os.environ) if env is None else env) else None
    if log := os.environ.get(LOG):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {'served' if server else 'exec'} {args[2]} {_server.ok} {_server.proc.poll()}\n")
    return server


class Popen(subprocess.Popen):
    """subprocess.Popen, but the child of a `HEAVY` command is forked by the fork server."""

    def __init__(self, args, **kwargs) -> None:  # noqa: ANN001 - subprocess.Popen's
        self._server = _served(args, kwargs.get("env"))
        self._conn: socket.socket | None = None
        super().__init__(args, **kwargs)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest):  # noqa: ANN001
        if self._server is None:
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest)
        # subprocess.Popen's POSIX signature: ..., p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, ...
        p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite = rest[3:9]
        start_new_session = rest[-2] if sys.version_info >= (3, 11) else rest[-1]
        assert preexec_fn is None and not pass_fds, "the fork server runs no preexec_fn and passes no descriptors"
        stdio = [fd if fd != -1 else default for fd, default in ((p2cread, 0), (c2pwrite, 1), (errwrite, 2))]
        request = {"args": [os.fsdecode(a) for a in args], "env": dict(os.environ) if env is None else dict(env),
                   "cwd": os.fsdecode(cwd) if cwd is not None else os.getcwd(), "new_session": bool(start_new_session)}
        try:
            self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._conn.connect(self._server.path)
            socket.send_fds(self._conn, [json.dumps(request).encode()], stdio)
            self.pid = json.loads(self._conn.recv(4096))["pid"]
            self._child_created = True
            served.append(request["args"])
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _report(self, timeout: float | None) -> int | None:
        if self._conn is None:
            return None
        self._conn.settimeout(timeout)
        try:
            message = self._conn.recv(4096)
        except (TimeoutError, BlockingIOError):
            return None
        self._conn.close()
        self._conn = None
        self.returncode = json.loads(message)["returncode"] if message else -9  # no report: the watcher was killed
        return self.returncode

    def _internal_poll(self, *args, **kwargs):  # noqa: ANN002,ANN003
        if self._server is None:
            return super()._internal_poll(*args, **kwargs)
        return self.returncode if self.returncode is not None else self._report(0)

    def _wait(self, timeout: float | None):  # noqa: ANN202
        if self._server is None:
            return super()._wait(timeout)
        if self.returncode is None and self._report(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
        return self.returncode


def run(*popenargs, input=None, capture_output: bool = False, timeout: float | None = None, check: bool = False,  # noqa: A002
        **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run, with `Popen` above."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with Popen(*popenargs, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except BaseException:
            process.kill()
            process.wait()
            raise
        code = process.poll()
    if check and code:
        raise subprocess.CalledProcessError(code, process.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(process.args, code, stdout, stderr)  # type: ignore[arg-type]


def serve(path: str) -> None:
    """The server: import, then fork a watcher per request; the watcher forks the child and reports on it."""
    # every entrypoint sets this before it imports transformers (utils/logs.setup: no weight-loading bars)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    prefork.preload(HEAVY)
    assert prefork.single_threaded(), "a fork server must run one thread"
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the watchers are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(PARENT_POLL_S)
    parent = os.getppid()
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:  # its pytest worker is gone, however it ended: so is the server
                os._exit(0)
            continue
        conn.settimeout(None)
        prefork.flush_stdio()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _watch(conn)
        conn.close()


def _watch(conn: socket.socket) -> None:
    try:
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            try:
                conn.close()
                os.chdir(request["cwd"])
                if request["new_session"]:
                    os.setsid()
                prefork.become(request["args"], request["env"], tuple(fds))
            except BaseException:  # noqa: BLE001 - nothing may return into the server's loop from here
                traceback.print_exc()
            os._exit(1)
        for fd in fds:
            os.close(fd)
        conn.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        conn.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
    except BaseException:  # noqa: BLE001 - a test gone mid-way (a broken pipe) ends only this watcher
        pass
    os._exit(0)


if __name__ == "__main__":
    serve(sys.argv[1])

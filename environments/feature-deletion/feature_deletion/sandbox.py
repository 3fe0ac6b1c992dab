"""Run an untrusted command (an agent's code, a test suite it edited) in a sandbox.

Isolation, all from the kernel, no daemon (see sandbox_init.py for the process tree):
- user namespace: uid 0 inside maps to an unprivileged host uid (65534 when we are root, our own
  uid otherwise); every capability is dropped before the command runs. Not being host root is
  what makes RLIMIT_NPROC bind (the kernel exempts real root from it).
- mount namespace + pivot_root onto an empty tmpfs: only /usr (and the /bin, /lib links), the
  interpreter's prefix, the task's test environment (or an allow-listed site-packages), the
  working copy (at /sandbox/repo) and declared extra mounts are visible; site-/dist-packages,
  bundled wheels and /usr/src are masked;
  /tmp is a private tmpfs; the root is read-only.
- net namespace (loopback only), ipc and uts namespaces.
- pid namespace: when the command ends or is killed, the kernel kills everything it forked.
- rlimits: address space, processes, file size, CPU seconds, open files; niceness.
- cgroup v1 pids + memory groups where this process may create them (sandbox_cgroup.py): a
  total memory and process cap for the whole sandbox, and a second way to kill every member.
- wall-clock timeout; output drained as it comes and truncated (head and tail kept).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from feature_deletion import sandbox_cgroup, sandbox_layout
from feature_deletion.pytest_run import PYTEST_DETERMINISM
from feature_deletion.sandbox_layout import DEFAULT_PACKAGES, SANDBOX_SITE, interpreter, python_argv, site_entries

SANDBOX_REPO = "/sandbox/repo"
TRUNCATION_MARKER = "[... sandbox: output truncated"
INIT_SCRIPT = Path(__file__).with_name("sandbox_init.py")
__all__ = ["DEFAULT_PACKAGES", "SANDBOX_SITE", "Limits", "Mount", "Result", "SandboxError", "SandboxUnavailable",
           "ensure_available", "interpreter", "python_argv", "run", "site_entries"]


class SandboxUnavailable(RuntimeError):
    """The kernel (or our privileges) does not allow the isolation we need: never run without it."""


class SandboxError(RuntimeError):
    """The sandbox failed to set itself up (not the command failing)."""


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 2048  # RLIMIT_AS per process; also the cgroup total where cgroups work
    nproc: int = 256  # RLIMIT_NPROC (threads count) and pids.max
    fsize_mb: int = 64  # RLIMIT_FSIZE: largest file a process may write
    cpu_s: int = 300  # RLIMIT_CPU per process
    nofile: int = 1024  # RLIMIT_NOFILE
    tmp_mb: int = 256  # size of the private /tmp
    output_kib: int = 64  # stdout and stderr each keep this much (head + tail)
    nice: int = 10  # be kind to the rest of the machine
    uid: int = 65534  # host uid the sandbox runs as when we are root
    cgroups: str = "auto"  # "auto": use when creatable; "require": fail without; "off"


@dataclass(frozen=True)
class Mount:
    src: Path
    dst: str
    writable: bool = False


@dataclass
class Result:
    returncode: int  # negative: killed by that signal (subprocess convention)
    stdout: str
    stderr: str
    timed_out: bool
    killed: bool  # ended by a signal: our timeout, the OOM killer, RLIMIT_CPU, ...
    duration_s: float = 0.0
    truncated: bool = False


def _chown_tree(path: Path, uid: int) -> None:
    # As root the sandbox is uid 65534 on the host: hand it the trees it may write.
    os.lchown(path, uid, uid)
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(top, name), uid, uid)


class _Capture:
    """Keep the first and last `cap/2` bytes of a stream and count what was dropped."""

    def __init__(self, cap: int) -> None:
        self.half, self.head, self.tail, self.dropped = cap // 2, bytearray(), bytearray(), 0

    def add(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > self.half:
            self.dropped += len(self.tail) - self.half
            del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        middle = f"\n{TRUNCATION_MARKER}: {self.dropped} bytes omitted ...]\n" if self.dropped else ""
        return self.head.decode(errors="replace") + middle + self.tail.decode(errors="replace")


def _drain(proc: subprocess.Popen, status_r: int, timeout_s: float, cap: int) -> tuple[_Capture, _Capture, bytes, bool]:
    out, err, status = _Capture(cap), _Capture(cap), bytearray()
    sinks = {proc.stdout.fileno(): out.add, proc.stderr.fileno(): err.add, status_r: status.extend}
    sel = selectors.DefaultSelector()
    for fd in sinks:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    deadline, timed_out = time.monotonic() + timeout_s, False
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            if timed_out:
                break  # killed 5 s ago and pipes still open: stop waiting
            timed_out, deadline = True, time.monotonic() + 5
            _kill_init(proc, bytes(status))
            continue
        for key, _ in sel.select(min(left, 1.0)):
            data = os.read(key.fd, 1 << 16)
            if data:
                sinks[key.fd](data)
            else:
                sel.unregister(key.fd)
    sel.close()
    return out, err, bytes(status), timed_out


def _kill_init(proc: subprocess.Popen, status: bytes) -> None:
    """Kill the namespace's init: the kernel then kills the rest, and our helper reaps it, so no
    zombie is left to the host's init. Falls back to the helper's group before init exists."""
    pids = [int(line[2:]) for line in status.decode().splitlines() if line.startswith("P ")]
    if pids and proc.poll() is None:
        try:
            os.kill(pids[0], signal.SIGKILL)
            return
        except ProcessLookupError:
            pass
    _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    try:  # the helper's group; its death cascades through PDEATHSIG to the pid namespace
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _parse_status(status: bytes) -> tuple[bool, int | None, str]:
    ready, code, error = False, None, ""
    for line in status.decode(errors="replace").splitlines():
        if line == "R":
            ready = True
        elif line.startswith("X "):
            code = os.waitstatus_to_exitcode(int(line[2:]))
        elif line.startswith("E "):
            error += line[2:] + "\n"
    return ready, code, error


def run(
    cmd: Sequence[str],
    workdir: Path,
    timeout_s: float,
    limits: Limits = Limits(),
    *,
    mounts: Sequence[Mount] = (),
    env: dict[str, str] | None = None,
    cwd: str = SANDBOX_REPO,
    packages: Sequence[str] = DEFAULT_PACKAGES,
    hidden_modules: Sequence[str] = (),
    site: Path | None = None,
) -> Result:
    """Run `cmd` with `workdir` mounted read-write at /sandbox/repo and nothing else of the host
    writable. `site`: a task's test environment (testenv.py), mounted read-only at /sandbox/site;
    without it the allow-listed `packages` of this venv are. `hidden_modules`: top-level module
    names that must not be visible (the task's own library); it is an error if one is there.
    `env` entries set to None are removed from the command's environment."""
    ensure_available()
    return _run(cmd, workdir, timeout_s, limits, mounts, env, cwd, packages, hidden_modules, site)


def _run(cmd, workdir, timeout_s, limits, mounts, env, cwd, packages, hidden_modules, site=None) -> Result:
    binds, masks, links = sandbox_layout.system_layout()
    try:
        site_binds, hiding, hidden_masks = sandbox_layout.python_mounts(tuple(packages), tuple(hidden_modules), site)
    except ValueError as e:
        raise SandboxError(str(e)) from None
    binds += [*site_binds, *hiding]  # after the site: some hide files inside it
    masks = [*masks, *hidden_masks]
    writable = [Mount(Path(workdir), SANDBOX_REPO, True), *mounts]
    for m in writable:
        binds.append({"src": str(Path(m.src).resolve()), "dst": m.dst, "rw": m.writable, "dir": Path(m.src).is_dir()})
        if m.writable and os.geteuid() == 0:
            _chown_tree(Path(m.src), limits.uid)
    base_env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "USER": "sandbox",
        "LANG": "C.UTF-8", "PYTHONPATH": SANDBOX_SITE, "PYTHONNOUSERSITE": "1", **PYTEST_DETERMINISM,
    }
    # The mount point for the new root: looked up after the switch to the sandbox uid, so it
    # must be traversable by it (a 0700 session directory is not).
    root = Path(tempfile.mkdtemp(prefix="fd-sandbox-root-"))
    root.chmod(0o755)
    status_r, status_w = os.pipe()
    spec = {
        "root": str(root), "binds": binds, "masks": masks, "symlinks": links,
        "files": sandbox_layout.ETC_GENERATED, "tmp_mb": limits.tmp_mb,
        "uid": limits.uid, "gid": limits.uid, "status_fd": status_w, "cwd": cwd,
        "argv": list(cmd), "env": {k: v for k, v in {**base_env, **(env or {})}.items() if v is not None},
        "nice": limits.nice, "rlimits": {
            "AS": limits.memory_mb << 20, "NPROC": limits.nproc, "FSIZE": limits.fsize_mb << 20,
            "CPU": limits.cpu_s, "NOFILE": limits.nofile, "CORE": 0,
        },
    }
    start = time.monotonic()
    cgroups = sandbox_cgroup.Cgroups()
    try:
        cgroups = sandbox_cgroup.create(limits.memory_mb, limits.nproc, limits.cgroups)
        spec["cgroup_procs"] = cgroups.procs_files  # the helper joins them before it forks
        proc = subprocess.Popen(
            [interpreter()[0], "-I", "-S", "-B", str(INIT_SCRIPT), json.dumps(spec)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(status_w,), start_new_session=True, env={"PATH": "/usr/bin:/bin"},
        )
        os.close(status_w)
        status_w = -1
        try:
            out, err, status, timed_out = _drain(proc, status_r, timeout_s, limits.output_kib << 10)
        except BaseException:
            _kill(proc)
            raise
        finally:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _kill(proc)
                proc.wait()
    finally:
        cgroups.destroy()
        os.close(status_r)
        if status_w >= 0:
            os.close(status_w)
        root.rmdir()
    ready, code, error = _parse_status(status)
    if error or (not ready and not timed_out):
        raise SandboxError(f"sandbox setup failed: {error or 'no status'} {err.text()[-2000:]}".strip())
    returncode = code if code is not None else -signal.SIGKILL
    return Result(
        returncode=returncode, stdout=out.text(), stderr=err.text(), timed_out=timed_out,
        killed=timed_out or returncode < 0, duration_s=time.monotonic() - start,
        truncated=bool(out.dropped or err.dropped),
    )


_available: str | None = None


def ensure_available() -> None:
    """Run one tiny sandbox; raise SandboxUnavailable (with what to change) if the kernel says no."""
    global _available
    if _available is not None:
        return
    with tempfile.TemporaryDirectory(prefix="fd-sandbox-probe-") as tmp:
        try:
            res = _run(python_argv("-c", "print('ok')"), Path(tmp), 60, Limits(), (), None, "/", (), ())
        except (SandboxError, OSError) as e:
            raise SandboxUnavailable(
                f"feature-deletion sandbox unavailable ({e}). It needs user, mount, pid and network "
                "namespaces for an unprivileged process: check sysctls user.max_user_namespaces > 0, "
                "kernel.unprivileged_userns_clone=1 (Debian), kernel.apparmor_restrict_unprivileged_userns=0 "
                "(Ubuntu 24.04+). Commands are never run unsandboxed."
            ) from e
    if res.returncode != 0 or res.stdout.strip() != "ok":
        raise SandboxUnavailable(f"feature-deletion sandbox probe failed: rc={res.returncode} {res.stderr[-2000:]}")
    _available = "ok"

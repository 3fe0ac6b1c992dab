"""The sandbox: isolation (network, filesystem, privileges) and containment (processes, memory,
time, output, file size). Every test runs the real thing: nothing is skipped or mocked except the
probe's error path."""

from __future__ import annotations

import os
import sys
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from feature_deletion import sandbox, sandbox_cgroup
from feature_deletion.sandbox import Limits, python_argv, run
from feature_deletion.hostguard import leaked_sandbox_pids, sandbox_pids

SMALL = Limits(memory_mb=512, nproc=32, cpu_s=30, fsize_mb=4, tmp_mb=32, output_kib=16)


def py(code: str, workdir: Path, timeout_s: float = 30, limits: Limits = SMALL, **kw) -> sandbox.Result:
    return run(python_argv("-c", code), workdir, timeout_s, limits, **kw)


def test_runs_and_reports(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("hello")
    res = py("import sys; print(open('in.txt').read()); print('err', file=sys.stderr); sys.exit(3)", tmp_path)
    assert (res.returncode, res.stdout, res.stderr.strip(), res.timed_out, res.killed) == (3, "hello\n", "err", False, False)


def test_working_copy_is_writable_and_seen_by_the_host(tmp_path: Path) -> None:
    res = py("import os; os.makedirs('d'); open('d/out.txt', 'w').write('made inside')", tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "d" / "out.txt").read_text() == "made inside"


def test_no_network(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.1)
    port = server.getsockname()[1]
    code = f"""
import socket
for addr in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
    try:
        socket.create_connection(addr, timeout=2).close()
        print("CONNECTED", addr)
    except OSError as e:
        print("blocked", addr, e.errno)
"""
    try:
        res = py(code, tmp_path)
        with pytest.raises(socket.timeout):
            server.accept()  # nothing reached the host's listener
    finally:
        server.close()
    assert "CONNECTED" not in res.stdout and res.stdout.count("blocked") == 3, res.stdout + res.stderr


def test_host_files_are_invisible(tmp_path: Path) -> None:
    secret = uuid.uuid4().hex
    host_files = [tmp_path / "host-secret.txt", Path(__file__).parent / f".secret-{secret}",
                  Path.home() / f".fd-secret-{secret}"]
    work = tmp_path / "work"
    work.mkdir()
    try:
        for f in host_files:
            f.write_text(secret)
        code = f"""
import os
import sys
for p in {[str(f) for f in host_files]!r}:
    try:
        open(p).read(); print("READ", p)
    except OSError:
        print("hidden")
print(sorted(os.listdir("/")))
print(sorted(os.listdir("/sandbox/site")))
for d in ["/usr/lib/python3/dist-packages", {os.path.join(sandbox.interpreter()[1], "lib")!r} + "/python3.11/site-packages"]:
    print(d, os.listdir(d) if os.path.isdir(d) else "absent")
print(os.path.exists("/work"), os.path.exists("/home"), os.path.exists({str(Path.home() / ".cache")!r}))
"""
        res = py(code, work)
    finally:
        for f in host_files:
            f.unlink(missing_ok=True)
    lines = res.stdout.splitlines()
    assert lines[:3] == ["hidden"] * 3, res.stdout + res.stderr
    assert set(eval(lines[3])) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "root", "sandbox",
                                   "sbin", "tmp", "usr"}
    visible = {name.split("-")[0].removesuffix(".py") for name in eval(lines[4])}
    assert visible <= {"pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "pygments", "coverage"}, visible
    assert all(line.endswith(("[]", "absent")) for line in lines[5:7]), lines[5:7]
    assert lines[7] == "False False False"


def test_writes_outside_the_working_copy_do_not_reach_the_host(tmp_path: Path) -> None:
    name = f"fd-escape-{uuid.uuid4().hex}"
    targets = ["/tmp/" + name, "/" + name, "/usr/" + name, "/etc/" + name, "/sandbox/site/" + name,
               "/root/" + name, "/work/" + name, "../" + name]
    code = f"""
import os
import sys
for p in {targets!r}:
    try:
        with open(p, "w") as f: f.write("x")
        print("wrote", p)
    except OSError as e:
        print("refused", p)
"""
    try:
        res = py(code, tmp_path)
        assert res.stdout.splitlines()[0] == f"wrote /tmp/{name}"  # a private /tmp: fine to write
        assert res.stdout.count("refused") == len(targets) - 1, res.stdout
        for host in [Path("/tmp", name), Path("/", name), Path("/root", name), Path("/work", name), tmp_path.parent / name]:
            assert not host.exists(), host
    finally:
        for host in [Path("/tmp", name), Path("/root", name), Path("/work", name), tmp_path.parent / name]:
            host.unlink(missing_ok=True)


def test_privileges_dropped(tmp_path: Path) -> None:
    code = """
import subprocess
print(open('/proc/self/status').read())
print('uid_map', open('/proc/self/uid_map').read().split())
print('nested', subprocess.run(['unshare', '-r', 'true'], capture_output=True).returncode)
"""
    out = py(code, tmp_path).stdout
    assert "CapEff:\t0000000000000000" in out and "CapBnd:\t0000000000000000" in out
    assert "NoNewPrivs:\t1" in out
    outer = 65534 if os.geteuid() == 0 else os.geteuid()  # never host root: RLIMIT_NPROC binds
    assert f"uid_map ['0', '{outer}', '1']" in out
    assert "nested 0" not in out  # no nested user namespace to regain capabilities in


def _watch_count(stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], len(sandbox_pids()))
        time.sleep(0.05)


FORK_BOMB = """
import os
import sys
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


@pytest.mark.parametrize("cgroups", ["auto", "off"])
def test_fork_bomb_contained_and_killed(tmp_path: Path, cgroups: str) -> None:
    """With cgroups off only RLIMIT_NPROC holds it (what an unprivileged CI host gets)."""
    before = sandbox_pids()
    stop, peak = threading.Event(), [0]
    watcher = threading.Thread(target=_watch_count, args=(stop, peak))
    watcher.start()
    try:
        t = time.monotonic()
        res = py(FORK_BOMB, tmp_path, timeout_s=3, limits=Limits(nproc=24, memory_mb=256, cgroups=cgroups))
        elapsed = time.monotonic() - t
    finally:
        stop.set()
        watcher.join()
    # a timeout test: stopped at its 3 s limit, where the bomb would spin forever; 5x margin on a slow host
    assert res.timed_out and res.killed and elapsed < 15
    assert 16 <= peak[0] <= 24 + len(before) + 2, f"{peak[0]} processes: not contained (or not seen)"
    assert not leaked_sandbox_pids()


def test_cgroups_are_removed_after_a_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[sandbox_cgroup.Cgroups] = []
    real = sandbox_cgroup.create
    monkeypatch.setattr(sandbox_cgroup, "create", lambda *a: made.append(real(*a)) or made[-1])
    py(FORK_BOMB, tmp_path, timeout_s=1, limits=Limits(nproc=16, memory_mb=256))
    dirs = [d for c in made for d in c.dirs]
    assert all(not d.exists() for d in dirs)
    if os.geteuid() == 0:  # root on a cgroup v1 host (here): the pids and memory groups were used
        assert len(dirs) == 2


def test_memory_hog_stopped(tmp_path: Path) -> None:
    code = "hog = []\nwhile True:\n    hog.append(b'x' * (16 << 20))"
    res = py(code, tmp_path, timeout_s=20, limits=Limits(memory_mb=256))
    assert res.returncode != 0 and not res.timed_out
    assert "MemoryError" in res.stderr or res.killed


def test_memory_of_many_processes_capped_by_the_cgroup(tmp_path: Path) -> None:
    """Four processes of 150 MB each under a 256 MB sandbox: the OOM killer stops one where
    cgroups are available; elsewhere each process is capped only by its own RLIMIT_AS."""
    code = """
import os, time
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(150 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(2)
        os._exit(0)
    kids.append(pid)
print(sorted(os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids))
"""
    res = py(code, tmp_path, timeout_s=30, limits=Limits(memory_mb=256, nproc=16))
    codes = eval(res.stdout.strip().splitlines()[-1])
    if sandbox_cgroup.available():
        assert -9 in codes, codes
    else:
        assert codes == [0, 0, 0, 0]


def test_infinite_loop_killed_with_everything_it_started(tmp_path: Path) -> None:
    # A child that leaves the process group and a grandchild that is orphaned: the pid namespace
    # still ends them all.
    code = """
import os
import sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True: pass
    os._exit(0)
while True: pass
"""
    t = time.monotonic()
    res = py(code, tmp_path, timeout_s=2)
    # a timeout test: the orphaned grandchild killed with the tree at the 2 s limit; 5x margin on a slow host
    assert res.timed_out and res.killed and time.monotonic() - t < 10
    assert not leaked_sandbox_pids()


def test_cpu_limit(tmp_path: Path) -> None:
    res = py("while True: pass", tmp_path, timeout_s=30, limits=Limits(cpu_s=1))
    assert not res.timed_out and res.killed and res.returncode in (-24, -9)  # SIGXCPU, then SIGKILL


def test_output_truncated_with_marker(tmp_path: Path) -> None:
    res = py("import sys\nsys.stdout.write('A' * 1000 + 'x' * 2_000_000 + 'Z' * 1000)", tmp_path)
    assert res.returncode == 0 and res.truncated
    assert sandbox.TRUNCATION_MARKER in res.stdout and len(res.stdout) < 17 * 1024
    assert res.stdout.startswith("A" * 1000) and res.stdout.endswith("Z" * 1000)


def test_endless_output_is_drained_and_capped(tmp_path: Path) -> None:
    res = py("import sys\nwhile True: sys.stdout.write('y' * 65536)", tmp_path, timeout_s=2)
    assert res.timed_out and res.truncated and len(res.stdout) < 17 * 1024


def test_file_size_limit(tmp_path: Path) -> None:
    code = "f = open('big.bin', 'wb')\ntry:\n    f.write(b'0' * (10 << 20)); f.flush()\nexcept OSError as e:\n    print('refused', e.errno)"
    res = py(code, tmp_path, limits=Limits(fsize_mb=1))
    assert "refused 27" in res.stdout  # EFBIG
    assert (tmp_path / "big.bin").stat().st_size <= 1 << 20


def test_unavailable_kernel_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def refuse(*a, **k):
        raise sandbox.SandboxError("sandbox setup failed: E sandbox child: unshare: Operation not permitted")

    monkeypatch.setattr(sandbox, "_available", None)
    monkeypatch.setattr(sandbox, "_run", refuse)
    with pytest.raises(sandbox.SandboxUnavailable, match="user.max_user_namespaces.*never run unsandboxed"):
        run(["true"], tmp_path, 5)


def test_task_library_never_exposed(tmp_path: Path) -> None:
    with pytest.raises(sandbox.SandboxError, match="task's own library"):
        run(["true"], tmp_path, 5, hidden_modules=["pluggy"])


UNPRIVILEGED_PROBE = """
import os, pathlib, sys, time, types
pkg = types.ModuleType("feature_deletion")  # the sandbox modules only, without the Taskset's imports
pkg.__path__ = [sys.argv[1]]
sys.modules["feature_deletion"] = pkg
from feature_deletion import sandbox
work = pathlib.Path(sys.argv[2])
res = sandbox.run(sandbox.python_argv("-c", "print(open('/proc/self/uid_map').read().split())"), work, 30, packages=())
print("map", res.stdout.strip(), res.returncode)
bomb = "import os\\nwhile True:\\n    try: os.fork()\\n    except OSError: pass"
res = sandbox.run(sandbox.python_argv("-c", bomb), work, 2, sandbox.Limits(nproc=16), packages=())
print("bomb", res.timed_out, res.killed)
"""


def test_unprivileged_host_path() -> None:
    """What CI without root gets: our own uid mapped, no cgroups, RLIMIT_NPROC alone against a
    fork bomb. As root we drop to uid 65534 to take that path for real."""
    import subprocess

    import shutil
    import tempfile

    package = Path(sandbox.__file__).parent
    work = Path(tempfile.mkdtemp(prefix="fd-unprivileged-"))  # under /tmp: reachable for uid 65534
    prefix: list[str] = []
    python = sys.executable
    if os.geteuid() == 0:
        os.chown(work, 65534, 65534)
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        # the venv's interpreter may sit under a 0700 /root: find one uid 65534 can run
        candidates = [os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"]
        python = next((c for c in candidates if subprocess.run([*prefix, "test", "-x", c]).returncode == 0), "")
        assert python, f"no python interpreter runnable by uid 65534 among {candidates}"
    try:
        out = subprocess.run([*prefix, python, "-c", UNPRIVILEGED_PROBE, str(package), str(work)],
                             capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    uid = 65534 if os.geteuid() == 0 else os.geteuid()
    assert f"map ['0', '{uid}', '1'] 0" in out.stdout, out.stdout + out.stderr
    assert "bomb True True" in out.stdout, out.stdout + out.stderr
    assert not leaked_sandbox_pids()


def test_copies_of_the_task_library_are_hidden(tmp_path: Path) -> None:
    # A test dependency vendoring the task's own library (urllib3 1.x carries six) must not hand
    # the original to the agent: inside the sandbox the copies read as empty or are gone.
    site = tmp_path / "site"
    (site / "dep" / "_vendor" / "tinylib").mkdir(parents=True)
    (site / "dep" / "_vendor" / "tinylib.py").write_text("ORIGINAL = 1\n")
    (site / "dep" / "_vendor" / "tinylib" / "__init__.py").write_text("ORIGINAL = 2\n")
    (site / "dep" / "_vendor" / "tinylib" / "src" / "tinylib").mkdir(parents=True)  # a copy in a copy
    (site / "dep" / "_vendor" / "tinylib" / "src" / "tinylib" / "__init__.py").write_text("ORIGINAL = 3\n")
    (site / "dep" / "__init__.py").write_text("")
    (site / "_pytest" / "_io").mkdir(parents=True)  # pytest's own module of that name: not a copy, kept
    (site / "_pytest" / "_io" / "tinylib.py").write_text("PYTEST_OWN = 1\n")
    code = ("import os\n"
            "print(repr(open('/sandbox/site/dep/_vendor/tinylib.py').read()))\n"
            "print(sorted(os.listdir('/sandbox/site/dep/_vendor/tinylib')))\n"
            "print(repr(open('/sandbox/site/_pytest/_io/tinylib.py').read()))\n")
    work = tmp_path / "work"
    work.mkdir()
    shown = sandbox.run(sandbox.python_argv("-c", code), work, 60, site=site)
    hidden = sandbox.run(sandbox.python_argv("-c", code), work, 60, site=site, hidden_modules=["tinylib"])
    own = "'PYTEST_OWN = 1\\n'"
    assert shown.stdout.splitlines() == ["'ORIGINAL = 1\\n'", "['__init__.py', 'src']", own], shown.stderr
    assert hidden.stdout.splitlines() == ["''", "[]", own], hidden.stderr

"""The tests' fork server (tests/support/forkserver.py) starts what subprocess would have started, as it would.

Every test that starts `rl`, an inference server, a trainer or `sft` goes through it, so what they read of
their processes (exit codes, the two streams, signals, sessions, working directory) must be subprocess's.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, free_port
from tests.support import forkserver

PY = [sys.executable, "-m"]


@pytest.fixture(autouse=True)
def serving(monkeypatch):
    monkeypatch.delenv(forkserver.OFF, raising=False)  # these tests are of the server: it serves here
    for name, value in forkserver._import_time(forkserver.BASELINE).items():  # as the server has them, whatever ran before
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


def stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...


def test_a_bad_config_exits_2_with_its_one_line_on_stderr_and_nothing_on_stdout(tmp_path):
    r = forkserver.run([*PY, "composer_prime.entrypoints.rl", "@", "configs/quickstart.toml", "--max_steps", "-5",
                        "--output_dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert forkserver.served[-1][2] == "composer_prime.entrypoints.rl"  # served, not exec'd
    assert (r.returncode, r.stdout) == (2, "") and len(r.stderr.strip().splitlines()) == 1 and "max_steps" in r.stderr


def test_a_served_server_is_a_fork_of_the_server_in_its_own_session_and_dies_by_the_signal_sent(tmp_path, tiny_model_dir):
    port = free_port()
    cmd = [*PY, "composer_prime.entrypoints.inference", "--model", str(tiny_model_dir), "--engine", "hf", "--port", str(port),
           "--output_dir", str(tmp_path / "out")]
    # what an in-process test's logs.setup leaves in the environment: read at import, yet no reason to exec
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    proc = forkserver.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        assert proc._server is forkserver._server and proc._server is not None
        first = proc.stdout.readline()  # written through, as the rest of its output: no buffer holds it back
        assert first, proc.wait()
        _, ppid, pgrp, session = stat(proc.pid)[:4]
        assert stat(int(ppid))[1] == str(proc._server.proc.pid)  # its watcher's parent is the server
        assert int(pgrp) == int(session) == proc.pid  # start_new_session
        assert os.readlink(f"/proc/{proc.pid}/cwd") == str(tmp_path)
        assert Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").strip() == " ".join(cmd).encode()
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
        assert proc.poll() is None
        for _ in range(1000):  # serving: the descriptors, environment and arguments it was given are its own
            assert proc.poll() is None
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail("the served inference server never answered /health")
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        assert "Loading weights" not in first + proc.stdout.read()  # transformers' bars off, as an exec'd one has them
    finally:
        proc.kill()


def test_what_the_server_cannot_be_is_exec_d(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # a plugin on the path: imported modules would not see it
    before = len(forkserver.served)
    r = forkserver.run([*PY, "composer_prime.entrypoints.rl", "@", "configs/quickstart.toml", "--max_steps", "-5",
                        "--output_dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and len(forkserver.served) == before
    for args, kwargs in (([*PY, "composer_prime.entrypoints.rl", "--help"], {"env": env}),
                         ([*PY, "composer_prime.entrypoints.lighthouse", "--help"], {}),
                         ([sys.executable, "-c", "pass"], {})):
        with forkserver.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, **kwargs) as p:
            assert p._server is None and p.wait(timeout=300) == 0


def test_a_server_first_asked_from_a_thread_outlives_the_thread(tmp_path, monkeypatch):
    """A worker's first request may come from a thread (test_volunteers.py's `asyncio.to_thread`). Linux's
    parent-death signal follows the thread that forked, so a server started with it died with that thread, and
    the worker exec'd every later command (test_forkserver failed in a fresh clone's suite, 2026-11-28)."""
    monkeypatch.setattr(forkserver, "_server", None)  # a server of this test's own, started below
    bad = [*PY, "composer_prime.entrypoints.rl", "@", "configs/quickstart.toml", "--max_steps", "-5",
           "--output_dir", str(tmp_path)]
    first = threading.Thread(target=forkserver.run, args=(bad,), kwargs={"cwd": ROOT, "capture_output": True})
    first.start()
    first.join()
    server = forkserver._server
    try:
        assert server is not None and forkserver.served[-1] == bad
        time.sleep(1)  # the death signal, had it been asked for, is sent as the thread ends
        assert server.proc.poll() is None
        r = forkserver.run(bad, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and len(forkserver.served) >= 2 and forkserver.served[-2:] == [bad, bad]
    finally:
        server.proc.kill()
        server.proc.wait()

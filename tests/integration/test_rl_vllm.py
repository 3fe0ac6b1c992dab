"""`rl` with the real vLLM engine: a short run trains on-policy-consistent log-probs, and no
process of the run survives either a normal end or a `kill -9` of the launcher."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from composer_prime.utils.net import bind_error
from tests.conftest import ROOT, free_port

MARK = "COMPOSER_PRIME_TEST_RUN"


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


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def start_rl(run: Path, tag: str, steps: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    while bind_error("127.0.0.1", port + 1000) is not None:  # vLLM's own server listens 1000 above ours
        port = free_port()
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/quickstart-vllm.toml",
           "--output_dir", str(run), "--max_steps", str(steps), "--inference.port", str(port),
           "--transport.address", f"tcp://127.0.0.1:{free_port()}", "--orchestrator.batch_size", "32",
           "--orchestrator.eval.interval", "100", "--orchestrator.eval.num_tasks", "16"]
    run.mkdir(parents=True, exist_ok=True)
    rl = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, MARK: tag}, stdout=subprocess.DEVNULL,
                          stderr=(run / "rl.stderr").open("w"))  # why it stopped, when it stops before its logs
    return rl, port


def wait_gone(tag: str, timeout: float) -> list[int]:
    deadline = time.time() + timeout
    while (left := run_processes(tag)) and time.time() < deadline:
        time.sleep(0.5)
    return left


def test_rl_on_vllm_runs_on_policy_and_leaves_nothing(tmp_path, tiny_model_dir):
    tag = uuid.uuid4().hex
    rl, port = start_rl(tmp_path / "run", tag, steps=4)
    assert rl.wait(timeout=600) == 0, (tmp_path / "run" / "rl.stderr").read_text()[-3000:]
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    # Step 0 is on-policy: vLLM's processed log-probs and the trainer's must be the same distribution.
    assert rows[0]["mismatch_kl"] < 1e-5, rows[0]
    assert (tmp_path / "run" / "logs" / "vllm.log").stat().st_size > 0  # vLLM's own server ran (not the fallback)
    assert wait_gone(tag, 10) == []
    assert port_free(port) and port_free(port + 1000)  # our server and vLLM's


def test_kill_9_of_the_launcher_takes_vllm_and_all_processes_down(tmp_path, tiny_model_dir):
    tag = uuid.uuid4().hex
    run = tmp_path / "run"
    rl, port = start_rl(run, tag, steps=50)
    metrics = run / "trainer" / "metrics.jsonl"
    deadline = time.time() + 600
    while not (metrics.exists() and metrics.read_text().count("\n") >= 1) and time.time() < deadline:
        assert rl.poll() is None, "rl ended early"
        time.sleep(0.5)
    assert len(run_processes(tag)) >= 5  # rl, inference, vLLM (+ engine core), orchestrator, trainer (its one rank)
    os.kill(rl.pid, signal.SIGKILL)  # no chance to clean up: the parent-death signal must do it
    rl.wait()
    left = wait_gone(tag, 90)
    assert left == [], [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left]
    assert port_free(port) and port_free(port + 1000)

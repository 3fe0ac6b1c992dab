"""`rl` on the tiny model with the real vLLM engine (configs/quickstart-vllm.toml): its first step trains
on-policy-consistent log-probs, and no process of the run survives a `kill -9` of the launcher.

One run, at the plumbing's size (one group of 8 a step, 2 held-out tasks): vLLM's start-up is most of what
it costs. That no process survives a normal end of a run on vLLM is test_rl_smollm2.py's (the suite's one
SmolLM2 run, on vLLM too: it ends normally, and is found by the same marker, tests/support/marked_runs.py);
this file ran a second 4-step run on the tiny model for it, and for step 0's log-probs, read here now."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.conftest import ROOT, free_port
from tests.support.marked_runs import left_behind, marked_env, port_free, run_processes, vllm_port, wait_gone

# k3 estimate of KL(trainer || vLLM) per token at step 0 (on-policy): float32 on both sides. test_rl_smollm2.py's bound too.
MISMATCH_KL = 1e-5


def start_rl(run: Path, tag: str, steps: int) -> tuple[subprocess.Popen, int]:
    port = vllm_port()
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/quickstart-vllm.toml",
           "--output_dir", str(run), "--max_steps", str(steps), "--inference.port", str(port),
           "--transport.address", f"tcp://127.0.0.1:{free_port()}", "--orchestrator.batch_size", "8",
           "--orchestrator.eval.interval", "100", "--orchestrator.eval.num_tasks", "2"]
    run.mkdir(parents=True, exist_ok=True)
    rl = subprocess.Popen(cmd, cwd=ROOT, env=marked_env(tag), stdout=subprocess.DEVNULL,
                          stderr=(run / "rl.stderr").open("w"))  # why it stopped, when it stops before its logs
    return rl, port


def test_rl_on_vllm_is_on_policy_and_kill_9_of_the_launcher_takes_vllm_and_all_processes_down(tmp_path, tiny_model_dir):
    tag = uuid.uuid4().hex
    run = tmp_path / "run"
    rl, port = start_rl(run, tag, steps=50)
    metrics = run / "trainer" / "metrics.jsonl"
    deadline = time.time() + 600
    while not (metrics.exists() and metrics.read_text().count("\n") >= 1) and time.time() < deadline:
        assert rl.poll() is None, "rl ended early: " + (run / "rl.stderr").read_text()[-3000:]
        time.sleep(0.5)
    assert len(run_processes(tag)) >= 5  # rl, inference, vLLM (+ engine core), orchestrator, trainer (its one rank)
    os.kill(rl.pid, signal.SIGKILL)  # no chance to clean up: the parent-death signal must do it
    rl.wait()
    left = wait_gone(tag, 90)
    assert left == [], left_behind(left)
    assert port_free(port) and port_free(port + 1000)  # our server and vLLM's

    first = json.loads(metrics.read_text().splitlines()[0])
    assert first["step"] == 0
    # Step 0 is on-policy: vLLM's processed log-probs and the trainer's must be the same distribution.
    assert first["mismatch_kl"] < MISMATCH_KL, first
    assert (run / "logs" / "vllm.log").stat().st_size > 0  # vLLM's own server ran (not the fallback)

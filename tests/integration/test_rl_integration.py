"""`rl` runs the three real processes on the CPU: a killed trainer stops everything and `--resume`
continues exactly; KL to a frozen reference starts at 0, grows, and is still measured against that
reference after the resume. One run (a module fixture) is read by both tests: 10 steps of 4 groups of 8
with a checkpoint every 2, the trainer killed once past step 3, then resumed; the k3 term on
(kl_coef 0.05, lr 1e-3 from step 1, so the policy moves within a step or two). It was two runs, a
crashed 10-step one and a 4-step KL one, each of 128 rollouts a step. (The processes started alone
from the configs `rl --dry-run` writes: test_separate_machines.py; learning on held-out tasks through a relay:
test_rl_volunteers.py.)"""

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support import forkserver
from tests.support.rl_runs import log_tails, rl_args, rows

STEPS = 10


@dataclass
class Crashed:
    run: Path
    done_before: int  # trainer steps logged when it was killed
    crashed_at: float  # time.time() of the kill
    rc: int  # rl's exit code after the kill
    left: list[str]  # processes of the run alive a second after rl exited
    resumed: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def crashed(tmp_path_factory, tiny_model_dir) -> Crashed:
    run = tmp_path_factory.mktemp("crash") / "run"
    args = rl_args(run, "--max_steps", str(STEPS), "--trainer.ckpt.interval", "2", "--orchestrator.batch_size", "32",
                   "--orchestrator.eval.num_tasks", "8", "--trainer.loss.rl.kl_coef", "0.05", "--trainer.optim.lr", "1e-3",
                   "--trainer.optim.warmup_steps", "1")
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", *args]
    rl = forkserver.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run / "trainer" / "metrics.jsonl"
    deadline = time.time() + 600
    while len(rows(metrics)) < 4 and time.time() < deadline and rl.poll() is None:
        time.sleep(0.2)
    assert len(rows(metrics)) >= 4, log_tails(run)
    # one rank: the trainer process itself is the rank (no torchrun)
    rank = forkserver.run(["pgrep", "-f", f"[-]m composer_prime.entrypoints.trainer @ {run}/configs/trainer.toml"],
                          capture_output=True, text=True).stdout.split()
    assert len(rank) == 1, f"trainer rank processes: {rank}"
    os.kill(int(rank[0]), signal.SIGKILL)
    crashed_at = time.time()
    rc = rl.wait(timeout=120)
    time.sleep(1)
    left = forkserver.run(["pgrep", "-f", str(run)], capture_output=True, text=True).stdout.split()
    done_before = len(rows(metrics))
    resumed = forkserver.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    return Crashed(run, done_before, crashed_at, rc, left, resumed)


def test_trainer_crash_stops_everything_and_resume_continues_exactly(crashed: Crashed):
    run = crashed.run
    assert crashed.rc == 1
    assert crashed.left == [], "orphan processes survived the launcher"
    assert crashed.resumed.returncode == 0, crashed.resumed.stdout[-3000:]
    metrics = rows(run / "trainer" / "metrics.jsonl")
    steps = [r["step"] for r in metrics]
    kept = [r["step"] for r in metrics if r["time"] < crashed.crashed_at]  # rows the resumed run did not redo
    done_before = crashed.done_before
    assert kept == list(range(len(kept))) and len(kept) % 2 == 0 and len(kept) >= done_before - 2, (kept, done_before)
    assert steps == list(range(STEPS)), steps  # nothing repeated, nothing skipped
    assert done_before < STEPS
    assert (run / "report.md").exists() and (run / "reward.png").stat().st_size > 1000


def test_kl_to_a_frozen_reference_starts_at_zero_and_grows(crashed: Crashed):
    """The k3 path end to end: the trainer loads the reference only when kl_coef > 0; the resumed trainer loads the
    same frozen reference (the starting model), not its checkpoint's policy, so its first step's k3 is not 0."""
    assert crashed.resumed.returncode == 0, crashed.resumed.stdout[-3000:]
    kl = [r["ref_kl"] for r in rows(crashed.run / "trainer" / "metrics.jsonl")]
    assert len(kl) == STEPS and abs(kl[0]) < 1e-7  # step 0: the policy is the reference, k3 is exactly 0
    assert all(k > 1e-6 for k in kl[2:]), kl  # k3 >= 0, and the policy has moved away from it (resumed steps too)

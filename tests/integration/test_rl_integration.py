"""`rl` runs the three real processes on the CPU: a killed trainer stops everything and `--resume`
continues exactly; KL to a frozen reference. (The processes started alone from the configs
`rl --dry-run` writes, learning on held-out tasks: test_separate_machines.py.)"""

import os
import signal
import subprocess
import sys
import time

from tests.conftest import ROOT
from tests.support import forkserver
from tests.support.rl_runs import log_tails, rl_args, rows


def test_trainer_crash_stops_everything_and_resume_continues_exactly(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    args = rl_args(run, "--max_steps", "10", "--trainer.ckpt.interval", "2")
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
    assert rl.wait(timeout=120) == 1
    time.sleep(1)
    left = forkserver.run(["pgrep", "-f", str(run)], capture_output=True, text=True).stdout.split()
    assert left == [], "orphan processes survived the launcher"
    done_before = len(rows(metrics))

    resumed = forkserver.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    steps = [r["step"] for r in rows(metrics)]
    kept = [r["step"] for r in rows(metrics) if r["time"] < crashed_at]  # rows the resumed run did not redo
    assert kept == list(range(len(kept))) and len(kept) % 2 == 0 and len(kept) >= done_before - 2, (kept, done_before)
    assert steps == list(range(10)), steps  # nothing repeated, nothing skipped
    assert done_before < 10
    assert (run / "report.md").exists() and (run / "reward.png").stat().st_size > 1000


def test_kl_to_a_frozen_reference_starts_at_zero_and_grows(tmp_path, tiny_model_dir):
    """The k3 path end to end: the trainer loads the reference only when kl_coef > 0."""
    run = tmp_path / "run"
    forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.rl", *rl_args(run, "--max_steps", "4"),
                    "--trainer.loss.rl.kl_coef", "0.05", "--trainer.optim.lr", "1e-3", "--trainer.optim.warmup_steps", "1"],
                   cwd=ROOT, check=True, timeout=600, capture_output=True)
    kl = [r["ref_kl"] for r in rows(run / "trainer" / "metrics.jsonl")]
    assert len(kl) == 4 and abs(kl[0]) < 1e-7  # step 0: the policy is the reference, k3 is exactly 0
    assert all(k > 1e-6 for k in kl[2:])  # k3 >= 0, and the policy has moved away from it

"""DiLoCo islands as `rl` runs them: whole inference + orchestrator + trainer groups, trainers synced
through a real torchft lighthouse on loopback (config/plan.plan_islands, trainer/diloco.py).

- One `rl` starts a lighthouse and two islands on the quickstart: held-out reward rises on both,
  every sync commits with both islands, one sync every H/P = 4 steps, the payload of each sync
  the synced fragment's float32 bytes.
- Islands on "separate machines" (an `rl` each, one lighthouse): island 1 joins late and heals from
  island 0 at its first sync; then island 1's trainer is killed with
  SIGKILL; its `rl` stops its island, island 0 keeps committing alone; island 1 started again with
  the same command and `--resume` heals from island 0 and finishes: every one of its steps trained
  exactly once, no step lost or repeated.
"""

import os
import signal
import subprocess
import sys
import time

import psutil

from tests.conftest import ROOT, free_port
from tests.support.rl_runs import log_tails, rl_args, rows

RL = [sys.executable, "-m", "composer_prime.entrypoints.rl"]


def syncs(trainer_rows: list[dict]) -> list[dict]:
    return [r for r in trainer_rows if r.get("diloco/syncs")]


def test_two_islands_learn_and_sync_every_four_steps(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    args = [*rl_args(run, "--max_steps", "40"), "@", "configs/diloco.toml", "--output_dir", str(run),
            "--diloco.lighthouse_port", str(free_port())]
    r = subprocess.run([*RL, *args], cwd=ROOT, capture_output=True, text=True, timeout=1500,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:] + log_tails(run)
    for k in (0, 1):
        island = run / f"island{k}"
        trainer = rows(island / "trainer" / "metrics.jsonl")
        assert [t["step"] for t in trainer] == list(range(40))
        done = syncs(trainer)
        assert [t["step"] for t in done] == [3, 7, 11, 15, 19, 23, 27, 31, 35, 39]  # after every 4th inner step
        assert [int(t["diloco/fragment"]) for t in done] == [0, 1] * 5
        assert all(t["diloco/committed"] == 1 and t["diloco/participants"] == 2 for t in done)
        assert trainer[-1]["diloco/outer_step"] == 10
        evals = [e for e in rows(island / "orchestrator" / "metrics.jsonl") if "eval_reward" in e]
        assert evals[-1]["eval_reward"] > evals[0]["eval_reward"] + 0.05, (k, evals)
    bytes_ = [[t["diloco/bytes"] for t in syncs(rows(run / f"island{k}" / "trainer" / "metrics.jsonl"))] for k in (0, 1)]
    assert bytes_[0] == bytes_[1] and len(set(bytes_[0][0::2])) == 1 and bytes_[0][0] != bytes_[0][1]  # per fragment


def island_rl(run, k: int, lighthouse: str, steps: int, *extra: str) -> subprocess.Popen:
    args = [*rl_args(run, "--max_steps", str(steps), "--trainer.ckpt.interval", "4"), "@", "configs/diloco.toml",
            "--output_dir", str(run), "--diloco.island", str(k), "--diloco.lighthouse", lighthouse,
            "--diloco.min_islands", "1", "--diloco.timeout_s", "10", *extra]
    return subprocess.Popen([*RL, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)


def trainer_pid(rl: subprocess.Popen) -> int | None:
    for child in psutil.Process(rl.pid).children(recursive=True):
        if "composer_prime.entrypoints.trainer" in " ".join(child.cmdline()):
            return child.pid
    return None


def test_a_killed_island_heals_from_a_live_peer_and_loses_no_step(tmp_path, tiny_model_dir):
    port = free_port()
    house = subprocess.Popen([sys.executable, "-m", "composer_prime.entrypoints.lighthouse", "--port", str(port),
                              "--heartbeat_timeout_ms", "1000", "--join_timeout_ms", "500"], cwd=ROOT, start_new_session=True)
    lighthouse = f"127.0.0.1:{port}"
    runs = [tmp_path / "a", tmp_path / "b"]
    survivor = island_rl(runs[0], 0, lighthouse, 120)
    procs = [house, survivor]
    try:
        deadline = time.time() + 600
        while not syncs(rows(runs[0] / "island0" / "trainer" / "metrics.jsonl")):  # island 1 joins late
            assert time.time() < deadline and survivor.poll() is None, survivor.communicate()[0][-3000:]
            time.sleep(0.5)
        doomed = island_rl(runs[1], 1, lighthouse, 40)
        procs.append(doomed)
        while not (runs[1] / "island1" / "checkpoints" / "step_8" / "DONE").exists():
            assert time.time() < deadline and doomed.poll() is None, doomed.communicate()[0][-3000:]
            time.sleep(0.5)
        os.kill(trainer_pid(doomed), signal.SIGKILL)
        assert doomed.wait(timeout=120) == 1  # its rl stops the island
        restarted = island_rl(runs[1], 1, lighthouse, 40, "--resume")
        procs.append(restarted)
        out = restarted.communicate(timeout=900)[0]
        assert restarted.returncode == 0, out[-3000:] + log_tails(runs[1])
        assert survivor.wait(timeout=900) == 0, log_tails(runs[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=60)
    a = rows(runs[0] / "island0" / "trainer" / "metrics.jsonl")
    b = rows(runs[1] / "island1" / "trainer" / "metrics.jsonl")
    assert [t["step"] for t in b] == list(range(40))  # no step lost or repeated
    assert any(t["diloco/participants"] == 1 and t["diloco/committed"] == 1 for t in syncs(a))  # alone meanwhile
    heals = [t["step"] for t in b if t.get("diloco/heals")]
    assert heals[0] < 8 <= heals[-1], heals  # joining late, and again after the restart from its checkpoint at 8
    assert any(t["diloco/participants"] == 2 for t in syncs(b[heals[-1]:]))  # then together again
    assert [t["step"] for t in a] == list(range(120))

"""The real three processes on CPU: each started alone from the configs `rl --dry-run` writes."""

import os
import signal
import subprocess
import sys
import time

import httpx
from transformers import AutoTokenizer

from composer_prime.utils.chat import encode_chat
from tests.conftest import ROOT
from tests.support.rl_runs import STEPS, log_tails, rl_args, rows


def probe(url: str, ids: list[int]) -> tuple[list[int], list[float]]:
    r = httpx.post(f"{url}/inference/v1/generate", timeout=60,
                   json={"token_ids": ids, "sampling_params": {"max_tokens": 12, "temperature": 1.0, "seed": 5}})
    choice = r.json()["choices"][0]
    return choice["token_ids"], [c["logprob"] for c in choice["logprobs"]["content"]]


def test_three_processes_learn_on_held_out_tasks(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    py = sys.executable
    dry = subprocess.run([py, "-m", "composer_prime.entrypoints.rl", *rl_args(run), "--dry-run"],
                         cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    configs = run / "configs"
    import tomllib

    port = tomllib.loads((configs / "inference.toml").read_text())["port"]
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = {"inference": subprocess.Popen([py, "-m", "composer_prime.entrypoints.inference", "@", str(configs / "inference.toml")],
                                           cwd=ROOT, env=env, start_new_session=True)}
    try:
        for _ in range(240):
            try:
                httpx.get(f"{url}/health")
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        tok = AutoTokenizer.from_pretrained(tiny_model_dir)
        ids = encode_chat(tok, [{"role": "system", "content": "Reverse the letters."}, {"role": "user", "content": "h g c"}])
        before = probe(url, ids)
        for name in ("trainer", "orchestrator"):
            procs[name] = subprocess.Popen([py, "-m", f"composer_prime.entrypoints.{name}", "@", str(configs / f"{name}.toml")],
                                           cwd=ROOT, env=env, start_new_session=True)
        assert procs["orchestrator"].wait(timeout=900) == 0
        assert procs["trainer"].wait(timeout=120) == 0
        assert httpx.get(f"{url}/health").json()["weight_version"] == STEPS
        tokens, logprobs = probe(url, ids)  # same seed, new weights: new tokens or at least new log-probs
        n = min(len(logprobs), len(before[1]))
        assert tokens != before[0] or max(abs(a - b) for a, b in zip(logprobs[:n], before[1][:n])) > 1e-3
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=30)
    trainer = rows(run / "trainer" / "metrics.jsonl")
    assert [r["step"] for r in trainer] == list(range(STEPS))  # every batch reached the trainer once
    assert all(r["trained_tokens"] > 0 for r in trainer)
    evals = [r for r in rows(run / "orchestrator" / "metrics.jsonl") if "eval_reward" in r]
    assert evals[0]["eval_version"] == 0 and evals[-1]["eval_version"] == STEPS
    assert evals[-1]["eval_reward"] > evals[0]["eval_reward"] + 0.05, evals  # +0.10 to +0.11 in 3 runs at 50 steps


def test_trainer_crash_stops_everything_and_resume_continues_exactly(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    args = rl_args(run, "--max_steps", "10", "--trainer.ckpt.interval", "2")
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", *args]
    rl = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run / "trainer" / "metrics.jsonl"
    deadline = time.time() + 600
    while len(rows(metrics)) < 4 and time.time() < deadline and rl.poll() is None:
        time.sleep(0.2)
    assert len(rows(metrics)) >= 4, log_tails(run)
    # one rank: the trainer process itself is the rank (no torchrun)
    rank = subprocess.run(["pgrep", "-f", f"[-]m composer_prime.entrypoints.trainer @ {run}/configs/trainer.toml"],
                          capture_output=True, text=True).stdout.split()
    assert len(rank) == 1, f"trainer rank processes: {rank}"
    os.kill(int(rank[0]), signal.SIGKILL)
    crashed_at = time.time()
    assert rl.wait(timeout=120) == 1
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", str(run)], capture_output=True, text=True).stdout.split()
    assert left == [], "orphan processes survived the launcher"
    done_before = len(rows(metrics))

    resumed = subprocess.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=900)
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
    subprocess.run([sys.executable, "-m", "composer_prime.entrypoints.rl", *rl_args(run, "--max_steps", "4"),
                    "--trainer.loss.rl.kl_coef", "0.05", "--trainer.optim.lr", "1e-3", "--trainer.optim.warmup_steps", "1"],
                   cwd=ROOT, check=True, timeout=600, capture_output=True)
    kl = [r["ref_kl"] for r in rows(run / "trainer" / "metrics.jsonl")]
    assert len(kl) == 4 and abs(kl[0]) < 1e-7  # step 0: the policy is the reference, k3 is exactly 0
    assert all(k > 1e-6 for k in kl[2:])  # k3 >= 0, and the policy has moved away from it

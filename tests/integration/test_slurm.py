"""infra/slurm/rl.sbatch and islands.sbatch under a real SLURM: infra/slurm/local_cluster.py starts munged,
slurmctld and three slurmd (n1..n3 on this host) for the module, and the shipped scripts are submitted
unchanged, with only environment variables (no IMAGE: the project's venv instead of a container) and rl
flags after the config that keep the runs short (2 held-out tasks, 4 groups of 8 a step: the plumbing only). rl.sbatch twice: its trainer step cancelled mid-run
(`scancel <job>.<step>`: the job ends in one line naming it), then the same script with `--resume`
continuing from the checkpoint to the end. islands.sbatch: two islands and the lighthouse as one job,
both islands committing their syncs together. No skip: CI installs slurm-wlm and munge (.ci/run), and a
SLURM that cannot start fails here."""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port
from composer_prime.utils.run_dir import checkpoints
from tests.support.rl_runs import rows

_spec = importlib.util.spec_from_file_location("local_cluster", ROOT / "infra/slurm/local_cluster.py")
local_cluster = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(local_cluster)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The environment that talks to a three-node SLURM of this module's own daemons (stopped after)."""
    d = tmp_path_factory.mktemp("slurm")
    env = local_cluster.start(d)
    yield env, d
    local_cluster.stop(d)


def running_steps(env: dict, job: str) -> dict[str, tuple[str, str]]:
    """Each running step of the job (a heterogeneous job's components have job ids of their own): its name ->
    (its step id, the node it runs on)."""
    q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%A"], env=env, capture_output=True, text=True)
    ids = {job, *q.stdout.split()}
    s = subprocess.run(["squeue", "-s", "-h", "-o", "%i|%j|%N"], env=env, capture_output=True, text=True)
    return {name: (step, node) for step, name, node in (ln.split("|") for ln in s.stdout.splitlines())
            if step.split(".")[0].split("+")[0] in ids}


def wait_for_job(env: dict, job: str, timeout_s: float = 420) -> dict[str, str]:
    """Polls squeue until the job has left it; returns each step's name -> the node it ran on."""
    steps, deadline = {}, time.time() + timeout_s
    while time.time() < deadline:
        steps |= {name: node for name, (_, node) in running_steps(env, job).items()}
        q = subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True)
        if q.returncode == 0 and not q.stdout.strip():
            return steps
        time.sleep(0.3)
    subprocess.run(["scancel", job], env=env)
    raise AssertionError(f"job {job} still queued or running after {timeout_s:.0f}s; steps seen {steps}")


def submit(env: dict, log: Path, *args: str) -> str:
    """sbatch [options] <a shipped script, unchanged> [its arguments], its output to `log`; the job id."""
    r = subprocess.run(["sbatch", "--parsable", "-o", str(log), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def job_env(slurm_env: dict, out: Path) -> dict:
    env = {**slurm_env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OUTPUT_DIR": str(out),
           "INFERENCE_PORT": str(free_port()), "TRANSPORT_PORT": str(free_port()), "HF_HUB_OFFLINE": "1"}
    env.pop("IMAGE", None)
    return env


def ended(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("rl.sbatch: the ")]


def test_rl_sbatch_cancelled_step_ends_the_job_in_one_line_and_resume_finishes_on_three_nodes(slurm, tmp_path, tiny_model_dir):
    env, d = slurm
    out = tmp_path / "run"
    env = job_env(env, out)
    config = ["infra/slurm/rl.sbatch", "configs/quickstart.toml", "--orchestrator.eval.num_tasks", "2",
              "--orchestrator.batch_size", "32"]
    # 1. a long run, its trainer step cancelled once a checkpoint is written
    first_log = tmp_path / "first.out"
    job = submit(env, first_log, *config, "--max_steps", "1000", "--trainer.ckpt.interval", "2")
    deadline = time.time() + 420
    while not checkpoints(out) or "trainer" not in (steps := running_steps(env, job)):
        assert time.time() < deadline, (first_log.read_text() if first_log.exists() else "")[-3000:]
        time.sleep(0.3)
    subprocess.run(["scancel", steps["trainer"][0]], env=env, check=True)
    wait_for_job(env, job)
    first = first_log.read_text()
    assert ended(first) == [ended(first)[0]] and ended(first)[0].startswith("rl.sbatch: the trainer step on n2 ended (exit "), \
        first[-3000:]  # one line, naming the cancelled step; the steps SLURM then cancels say nothing
    last, _ = checkpoints(out)[-1]
    assert 2 <= last < 1000
    # 2. the same script, --resume after the config: from that checkpoint to 2 steps past it, to the end
    log = tmp_path / "job.out"
    job = submit(env, log, *config, "--resume", "--max_steps", str(last + 2))
    steps = wait_for_job(env, job)
    text = log.read_text() if log.exists() else ""
    assert {k: steps.get(k) for k in ("inference", "trainer", "orchestrator")} == \
        {"inference": "n1", "trainer": "n2", "orchestrator": "n3"}, (steps, text[-3000:])
    done = [ln for ln in (d / "jobcomp.txt").read_text().splitlines() if f"HetJobId={job} " in ln]
    assert len(done) == 3 and all("JobState=COMPLETED" in ln for ln in done), done  # every component ended cleanly
    orch = (out / "configs/orchestrator.toml").read_text()
    assert f"http://n1:{env['INFERENCE_PORT']}" in orch and f"tcp://n2:{env['TRANSPORT_PORT']}" in orch  # found by host name
    trained = rows(out / "trainer" / "metrics.jsonl")
    assert [m["step"] for m in trained] == list(range(last + 2)), text[-3000:]  # continued, no step repeated
    assert all(m["trained_tokens"] > 0 for m in trained)
    assert f"resumed from {out / 'checkpoints' / f'step_{last}'}" in text and "[orchestrator] final held-out reward" in text, \
        text[-3000:]
    assert len(ended(text)) == 1 and " ended (exit 0)" in ended(text)[0], ended(text)  # one line: the step that ended it


def test_islands_sbatch_runs_two_islands_and_the_lighthouse_as_one_job_committing_together(slurm, tmp_path, tiny_model_dir):
    env, d = slurm
    out = tmp_path / "run"
    env = {**job_env(env, out), "LIGHTHOUSE_PORT": str(free_port())}
    # a lighthouse slow to listen (a container pulled, a loaded node): the islands must wait for it, not refuse it
    # (CI's host once started an island before the lighthouse bound its port: "nothing answers at n1:...")
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "lighthouse").write_text(f"#!/bin/bash\nsleep 4\nexec {Path(sys.executable).parent / 'lighthouse'} \"$@\"\n")
    (slow / "lighthouse").chmod(0o755)
    env["PATH"] = f"{slow}:{env['PATH']}"
    log = tmp_path / "job.out"
    # H = 4 and 2 fragments: a sync every 2 steps, each fragment's once in 4
    job = submit(env, log, "--nodes=2", "infra/slurm/islands.sbatch", "configs/quickstart.toml", "--max_steps", "4",
                 "--diloco.sync_every", "4", "--orchestrator.eval.num_tasks", "2", "--orchestrator.batch_size", "32",
                 "--inference.port", env["INFERENCE_PORT"],
                 "--transport.address", f"tcp://127.0.0.1:{env['TRANSPORT_PORT']}")
    wait_for_job(env, job)
    text = log.read_text() if log.exists() else ""
    assert [ln for ln in (d / "jobcomp.txt").read_text().splitlines() if f"JobId={job} " in ln and "JobState=COMPLETED" in ln], \
        text[-3000:]
    for k in (0, 1):
        trainer = rows(out / f"island{k}" / "trainer" / "metrics.jsonl")
        assert [t["step"] for t in trainer] == [0, 1, 2, 3], text[-3000:]
        synced = [t for t in trainer if t.get("diloco/syncs")]
        assert [(t["step"], int(t["diloco/fragment"])) for t in synced] == [(1, 0), (3, 1)], synced
        assert all(t["diloco/committed"] == 1 and t["diloco/participants"] == 2 for t in synced), synced

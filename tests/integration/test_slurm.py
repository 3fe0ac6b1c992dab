"""infra/slurm/rl.sbatch under a real SLURM: infra/slurm/local_cluster.py starts munged, slurmctld and
three slurmd (n1..n3 on this host) for the module, and the shipped script is submitted unchanged, with
only environment variables (no IMAGE: the project's venv instead of a container) and rl flags after the
config that make the run three steps. No skip: CI installs slurm-wlm and munge (.ci/run), and a SLURM
that cannot start fails here."""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port
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


def wait_for_job(env: dict, job: str, timeout_s: float = 420) -> dict[str, str]:
    """Polls squeue until the job has left it; returns each step's name -> the node it ran on."""
    steps, ids, deadline = {}, {job}, time.time() + timeout_s
    while time.time() < deadline:
        q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%A"], env=env, capture_output=True, text=True)
        ids |= set(q.stdout.split())  # a heterogeneous job's components have job ids of their own
        s = subprocess.run(["squeue", "-s", "-h", "-o", "%i|%j|%N"], env=env, capture_output=True, text=True)
        for ln in s.stdout.splitlines():
            step, name, node = ln.split("|")
            if step.split(".")[0].split("+")[0] in ids:
                steps[name] = node
        if q.returncode == 0 and not q.stdout.strip():
            return steps
        time.sleep(0.3)
    subprocess.run(["scancel", job], env=env)
    raise AssertionError(f"job {job} still queued or running after {timeout_s:.0f}s; steps seen {steps}")


def test_rl_sbatch_runs_three_heterogeneous_steps_on_their_own_nodes_and_trains(slurm, tmp_path, tiny_model_dir):
    env, d = slurm
    out = tmp_path / "run"
    env = {**env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OUTPUT_DIR": str(out),
           "INFERENCE_PORT": str(free_port()), "TRANSPORT_PORT": str(free_port()), "HF_HUB_OFFLINE": "1"}
    env.pop("IMAGE", None)
    log = tmp_path / "job.out"
    r = subprocess.run(["sbatch", "--parsable", "-o", str(log), "infra/slurm/rl.sbatch", "configs/quickstart.toml",
                        "--max_steps", "3", "--orchestrator.eval.num_tasks", "2"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    steps = wait_for_job(env, job)
    text = log.read_text() if log.exists() else ""
    assert {k: steps.get(k) for k in ("inference", "trainer", "orchestrator")} == \
        {"inference": "n1", "trainer": "n2", "orchestrator": "n3"}, (steps, text[-3000:])
    done = [ln for ln in (d / "jobcomp.txt").read_text().splitlines() if f"HetJobId={job} " in ln]
    assert len(done) == 3 and all("JobState=COMPLETED" in ln for ln in done), done  # every component ended cleanly
    orch = (out / "configs/orchestrator.toml").read_text()
    assert f"http://n1:{env['INFERENCE_PORT']}" in orch and f"tcp://n2:{env['TRANSPORT_PORT']}" in orch  # found by host name
    trained = rows(out / "trainer" / "metrics.jsonl")
    assert [m["step"] for m in trained] == [0, 1, 2], text[-3000:]
    assert all(m["trained_tokens"] > 0 for m in trained)
    assert "[orchestrator] final held-out reward" in text, text[-3000:]
    ended = [ln for ln in text.splitlines() if ln.startswith("rl.sbatch: the ")]
    assert len(ended) == 1 and " ended (exit 0)" in ended[0], ended  # one line: the step that ended the job

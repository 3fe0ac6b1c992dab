"""No silent hangs (issue 37): a trainer that hangs mid-run is found by `rl`'s watchdog, named with
the function it hangs in, every process's stacks are written, the run stops, and `--resume` then
continues it to the end.

The hang is a test plug-in (tests/plugins/hang_once.py): a loss channel with no weights that, after
optimizer step 4, sleeps forever in Python, once. The quickstart's tiny model takes about a second a
step here, so the watchdog's floor (12 s) is the limit that applies."""

import os
import subprocess
import sys
import time

from tests.conftest import ROOT
from tests.support.rl_runs import log_tails, rl_args, rows

STEPS, HANG_AT = 8, 4


def test_a_hung_trainer_is_named_with_its_function_and_resume_continues(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "plugins"), str(ROOT)]),
           "HANG_ONCE": str(tmp_path / "hung"), "HANG_AT": str(HANG_AT)}
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl",
           *rl_args(run, "--max_steps", str(STEPS), "--trainer.ckpt.interval", "2"),
           "--trainer.loss.plugins", '["hang_once:HangOnce"]', "--watchdog.floor_s", "12", "--watchdog.factor", "5"]
    t0 = time.time()
    hung = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert hung.returncode == 1, hung.stdout[-2000:] + hung.stderr[-2000:] + log_tails(run)
    line = hung.stderr.strip().splitlines()[-1]
    assert line.startswith("error: no process advanced for ") and "Traceback" not in hung.stderr, hung.stderr[-2000:]
    assert f"trainer stopped in hang_once.py:28 in after_step; every process's stacks: {run}/logs/watch/*.stacks" in line
    # found and stopped soon after the hang: the 12 s limit, the stacks asked for, the others stopped
    assert time.time() - (tmp_path / "hung").stat().st_mtime < 60 and time.time() - t0 < 300
    stacks = {p.name.rpartition("-")[0]: p.read_text() for p in (run / "logs" / "watch").glob("*.stacks")}
    assert set(stacks) >= {"trainer", "orchestrator", "inference"}, sorted(stacks)
    assert stacks["trainer"].startswith("WHERE hang_once.py:28 in after_step") and "thread MainThread:" in stacks["trainer"]
    assert "task " in stacks["orchestrator"]  # an event loop's tasks, each with the frames it awaits in
    assert [r["step"] for r in rows(run / "trainer" / "metrics.jsonl")] == list(range(HANG_AT - 1))  # the 4th step (3) hung

    assert (run / "logs" / "watchdog.log").read_text().strip().endswith(line.removeprefix("error: ").removesuffix(
        "; stopped (continue with --resume)"))  # the run's own record of it

    resumed = subprocess.run(cmd + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:] + log_tails(run)
    assert [r["step"] for r in rows(run / "trainer" / "metrics.jsonl")] == list(range(STEPS))  # nothing lost or redone
    assert len(list((run / "logs" / "watch").glob("trainer-*.stacks"))) == 1  # the hung run's stacks outlive the resume

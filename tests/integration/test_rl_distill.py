"""Hint self-distillation in the real loop: tool-calc, the three processes, GRPO + distill.

The tiny model is warm-started on tool-calc demonstrations that include wrong calls (the README's
warm start, the session's `tool_calc_warm_start`), so its rollouts have error turns; every step whose
batch carries hinted error turns must show a non-zero distill loss in the trainer (a channel that is
silently zero fails here). The collapse guards are off in both runs (shared_runs.NO_GUARDS says why: the test-sized
warm start's groups are all flat). With the trainer's teacher this reads the README's run (the session's
`tool_calc_distill_run`, which test_readme.py reads too); the inference teacher is a run of its own.
"""

import json
import sys
from pathlib import Path

from tests.conftest import ROOT, free_port
from tests.support import forkserver
from tests.support.shared_runs import NO_GUARDS, DistillRun, WarmStart

STEPS = 3


def rows(path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def check_distill_in_every_step(run: Path, steps: int) -> None:
    orch = [r for r in rows(run / "orchestrator" / "metrics.jsonl") if "distill/sites" in r]
    trainer = {r["step"]: r for r in rows(run / "trainer" / "metrics.jsonl")}
    assert len(orch) == steps and len(trainer) == steps
    assert all(r["distill/sites"] > 0 for r in orch)  # the warm-started policy errs: there is something to distill
    for r in orch:
        t = trainer[r["step"]]
        if r["distill/tokens"] > 0:
            assert t["loss/distill"] > 0, (r, t)
        else:
            assert "loss/distill" not in t
    assert sum(r["distill/tokens"] > 0 for r in orch) == steps
    assert all(0 < r["distill/hinted_frac"] <= 1 for r in orch)
    evals = [r for r in rows(run / "orchestrator" / "metrics.jsonl") if "eval/tool-calc/tool_error_rate" in r]
    assert evals and all(0 <= r["eval/tool-calc/tool_error_rate"] <= 1 for r in evals)
    assert "eval/tool-calc/sites/unknown_tool" in evals[0]


def test_distill_loss_is_nonzero_in_every_step_with_error_sites_trainer_teacher(tool_calc_distill_run: DistillRun):
    """The config's own teacher (the trainer's EMA of the policy), on the README's run (the session's, 3 steps of 16)."""
    check_distill_in_every_step(tool_calc_distill_run.run, STEPS)


def test_distill_loss_is_nonzero_in_every_step_with_error_sites_inference_teacher(tmp_path, tool_calc_warm_start: WarmStart):
    """The inference server's prefill top-k log-probs as the teacher (the served policy: `current` in the trainer)."""
    run = tmp_path / "run"
    rl = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/tool-calc-distill.toml",
                         "--model", str(tool_calc_warm_start.model), "--output_dir", str(run), "--max_steps", str(STEPS),
                         "--inference.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}",
                         "--orchestrator.batch_size", "16", "--orchestrator.group_size", "4", "--orchestrator.eval.num_tasks", "4",
                         "--orchestrator.distill.teacher", "inference", "--trainer.loss.distill.teacher", "current", *NO_GUARDS],
                        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert rl.returncode == 0, (rl.stdout + rl.stderr)[-3000:]
    check_distill_in_every_step(run, STEPS)

"""One `rl` step with SmolLM2-135M on the shipped CPU config (configs/smollm2-135m.toml), so the
real-model path (conversion from the wheel, a 49k vocabulary, the chat template, a weight swap of
0.5 GB) cannot rot. Only the sizes shrink: 2 groups of 4, 8 new tokens, 2 held-out tasks."""

import math
import shutil
import subprocess
import sys

from tests.conftest import ROOT, free_port
from tests.support.rl_runs import log_tails, rows


def test_one_rl_step_with_smollm2_on_the_cpu_config(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/smollm2-135m.toml", "--output_dir", str(run),
           "--max_steps", "1", "--orchestrator.batch_size", "8", "--orchestrator.group_size", "4",
           "--orchestrator.sampling.max_tokens", "8", "--orchestrator.eval.num_tasks", "2",
           "--inference.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:] + log_tails(run)
    assert (run / "weights" / "step_1" / "STABLE").exists()
    for heavy in ("weights", "checkpoints"):  # 2.7 GB (the optimizer state included) that pytest would keep for 3 runs
        shutil.rmtree(run / heavy)
    [step] = rows(run / "trainer" / "metrics.jsonl")
    assert step["step"] == 0 and step["trained_tokens"] > 0, step
    assert math.isfinite(step["loss/rl"]) and step["loss/rl"] != 0.0, step
    assert math.isfinite(step["grad_norm"]) and step["grad_norm"] > 0.0, step
    orch = rows(run / "orchestrator" / "metrics.jsonl")
    # held-out at the start on the converted weights, at the end on the trainer's step 1 as inference served it
    assert [r["eval_version"] for r in orch if "eval_version" in r] == [0, 1]

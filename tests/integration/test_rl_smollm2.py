"""`rl` with SmolLM2-135M on the shipped CPU config (configs/smollm2-135m.toml: vLLM-CPU), so the
real-model path (conversion from the wheel, a 49k vocabulary, the chat template, a weight swap of
0.5 GB with a tied head) cannot rot: 2 steps at max_async_level 0, 2 groups of 4, 8 new tokens,
2 held-out tasks (the suite's one SmolLM2 run; the breakdown benchmark's test runs the tiny model).
Both steps are on-policy, so the trainer's log-probs must equal the ones vLLM sampled with: at step 0
on the converted weights (a template or conversion mismatch between the two shows here), at step 1
on the weights the trainer swapped into vLLM (a swap that drops the tied lm_head shows here). And no
process of the run outlives its normal end, vLLM's included (test_rl_vllm.py's `kill -9` run is the
other end): the run is exec'd with a marker its processes inherit (tests/support/marked_runs.py)."""

import math
import subprocess
import sys
import uuid

from tests.conftest import ROOT, free_port
from tests.support.marked_runs import left_behind, marked_env, port_free, vllm_port, wait_gone
from tests.support.rl_runs import log_tails, rows

# k3 estimate of KL(trainer || vLLM) per token: 7.7e-9 and -1.5e-9 at steps 0 and 1 (2026-11-27, float32 on both
# sides); one step of policy lag (the shipped async run's step 1) gives 1.7e-3. test_rl_vllm.py's bound.
MISMATCH_KL = 1e-5


def test_two_synchronous_rl_steps_with_smollm2_are_on_policy(tmp_path):
    port, run, tag = vllm_port(), tmp_path / "run", uuid.uuid4().hex
    # the held-out evaluation only at the start and the end
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/smollm2-135m.toml", "--output_dir", str(run),
           "--max_steps", "2", "--orchestrator.max_async_level", "0", "--orchestrator.eval.interval", "1000000000",
           "--orchestrator.batch_size", "8", "--orchestrator.group_size", "4", "--orchestrator.sampling.max_tokens", "8",
           "--orchestrator.eval.num_tasks", "2", "--inference.port", str(port), "--transport.address",
           f"tcp://127.0.0.1:{free_port()}"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500,
                       env=marked_env(tag, OMP_NUM_THREADS="1"))  # as the breakdown benchmark ran it
    assert r.returncode == 0, f"{r.stderr[-2000:]}\n{log_tails(run)}"
    left = wait_gone(tag, 10)  # a normal end leaves nothing running
    assert left == [], left_behind(left)
    assert port_free(port) and port_free(port + 1000)  # our server and vLLM's
    assert (run / "logs" / "vllm.log").stat().st_size > 0  # vLLM's own server ran (not the fallback)
    steps = rows(run / "trainer" / "metrics.jsonl")
    assert [s["step"] for s in steps] == [0, 1] and all(s["trained_tokens"] > 0 for s in steps), steps
    for s in steps:
        assert math.isfinite(s["loss/rl"]) and math.isfinite(s["grad_norm"]) and s["grad_norm"] > 0.0, s
        assert abs(s["mismatch_kl"]) < MISMATCH_KL, s
    orch = rows(run / "orchestrator" / "metrics.jsonl")
    assert [r["policy_versions"] for r in orch if "policy_versions" in r] == [[0], [1]]  # each step sampled by its own policy
    # held-out at the start on the converted weights, at the end on the trainer's step 2 as vLLM served it
    assert [r["eval_version"] for r in orch if "eval_version" in r] == [0, 2]

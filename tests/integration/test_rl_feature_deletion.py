"""One full `rl` step on Feature Deletion: tool calls run in the sandbox, sandboxed scoring, an update.

The task set is the feature-deletion tests' hand-made one (environments/feature-deletion/tests/
sandbox_support.py: `tinylib.stats.mean` deleted, in the generator's exact format), so no build runs
here (building from PyPI is the README's sequence, test_readme_feature_deletion.py; from fixtures, the
environment's test_generate.py). The tiny model is first taught (a few seconds of `uv run sft`) to open
with a tool call, so that its rollouts really use the tools: half of its demonstrations run the tests, half
read the deleted function's file, so that episodes differ in length. It cannot rebuild functions, so rewards
are 0 and the group spread comes from the config's length penalty.
"""

import importlib.util
import json
import subprocess
import sys

from tests.conftest import ROOT, free_port
from tests.support import forkserver

SUPPORT = ROOT / "environments" / "feature-deletion" / "tests" / "sandbox_support.py"
CALLS = ['<tool_call>{"name": "run_tests", "arguments": {}}</tool_call>',
         '<tool_call>{"name": "read_file", "arguments": {"path": "tinylib/stats.py"}}</tool_call>']


def handmade_taskset(out):
    """The environment tests' one-task set, written to `out` (their helper, loaded from its file)."""
    spec = importlib.util.spec_from_file_location("feature_deletion_sandbox_support", SUPPORT)
    support = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(support)
    return support.make_handmade_taskset(out)


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=900, **kw)


def test_one_rl_step_on_feature_deletion(tmp_path, tiny_model_dir):
    tasks = handmade_taskset(tmp_path / "tasks")

    from composer_prime.env_runtime.tasksets import load_tasks, messages

    demos = tmp_path / "demos.jsonl"
    prompts = [messages(t) for t in load_tasks("feature-deletion", {"taskset_dir": str(tasks)})]
    assert len(prompts) == 1
    demos.write_text("".join(json.dumps({"messages": m + [{"role": "assistant", "content": c}]}) + "\n"
                             for m in prompts for c in CALLS))
    # 80 steps: fewer left the policy calling no tool (measured 2026-11-28, 2-core machine, loaded; the rl run's tool_calls
    # 0.0 after 10 steps at seeds 0, 1, 2, after 20 at seed 0 (at lr 3e-3: seeds 0, 1, 2), after 40 at seeds 0, 1 (at
    # lr 3e-3 too); after 60, 0.125 at seed 0 but 0.0 at seed 1)
    sft = run("composer_prime.entrypoints.sft", "--model", str(tiny_model_dir), "--data", str(demos), "--output_dir",
              str(tmp_path / "agent"), "--max_steps", "80", "--batch_size", "2", "--lr", "1e-3", "--warmup_steps", "5")
    assert sft.returncode == 0, sft.stderr[-2000:]

    run_dir = tmp_path / "run"
    env = f'[{{id = "feature-deletion", max_turns = 3, args = {{taskset_dir = "{tasks}"}}, eval_args = {{taskset_dir = "{tasks}"}}}}]'
    rl = run("composer_prime.entrypoints.rl", "@", "configs/feature-deletion.toml", "--model", str(tmp_path / "agent"),
             "--output_dir", str(run_dir), "--max_steps", "1", "--orchestrator.envs", env, "--orchestrator.eval.num_tasks", "1",
             "--orchestrator.sampling.max_tokens", "48", "--inference.port", str(free_port()),
             "--transport.address", f"tcp://127.0.0.1:{free_port()}")
    assert rl.returncode == 0, rl.stdout[-3000:] + rl.stderr[-3000:]
    step = next(json.loads(ln) for ln in (run_dir / "orchestrator" / "metrics.jsonl").read_text().splitlines()
                if "rollouts" in json.loads(ln))
    assert step["rollouts"] == 8
    assert step["env/feature-deletion/tool_calls"] > 0  # the policy called tools, which ran in the sandbox
    assert 0.0 <= step["env/feature-deletion/reward"] <= 1.0  # sandboxed scoring ran for every rollout
    assert step["adv_abs_mean"] > 0, step
    trainer = [json.loads(ln) for ln in (run_dir / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert len(trainer) == 1 and trainer[0]["trained_tokens"] > 0 and trainer[0]["grad_norm"] > 0
    assert (run_dir / "weights").exists()


def test_a_missing_task_set_is_a_clear_error(tmp_path):
    from composer_prime.env_runtime.tasksets import EnvError, load_tasks

    try:
        load_tasks("feature-deletion", {"taskset_dir": str(tmp_path / "nope")})
    except EnvError as e:
        assert "nope" in str(e) and "build-tasks" in str(e)
    else:
        raise AssertionError("loading a missing task set must fail")

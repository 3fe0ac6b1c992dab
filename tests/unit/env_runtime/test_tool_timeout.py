"""A tool that never returns is cut like a reward (env_runtime/episode.py, calls.py): a verifiers environment's
tool-session calls run in its CallBox under `call_timeout_s`, so a tool function that blocks its thread (a
`time.sleep` loop under the session's `async def call`, which no cancellation reaches) drops the rollout as
dropped/timeout, naming the tool, the task and where it is stuck, and the orchestrator's loop goes on.

Real: tool-calc's tasks and session, the environment loaded as a run loads it (`load_env`: its CallBox at the
configured timeout), the orchestrator's `rollout`, the tiny model's tokenizer; scripted: the model's turns
(tests/support/scripted.py) and the tool function itself (tool_calc.taskset.answer), which blocks until
released or for BLOCK_S at most. Without the fix the tool call ran on the orchestrator's own loop, holding it:
the rollout waited BLOCK_S and came back scored, not dropped."""

import asyncio
import threading
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from composer_prime.config.envs import EnvConfig
from composer_prime.config.sampling import SamplingParams
from composer_prime.env_runtime.envs import load_env
from composer_prime.env_runtime.errors import EnvError
from composer_prime.orchestrator.rollouts import rollout, stop_if_every_call_timed_out
from tests.support.scripted import RIGHT, ScriptedPolicy

BLOCK_S = 10.0  # the tool's hang, bounded so that a test run without the fix fails rather than hangs
TIMEOUT_S = 0.5


@pytest.fixture
def blocked(monkeypatch) -> threading.Event:
    """tool-calc's tool function, blocking its thread until the event is set (or BLOCK_S at most)."""
    import tool_calc.taskset as taskset

    release, real_answer = threading.Event(), taskset.answer

    def answer(name: str, arguments: dict) -> dict:
        deadline = time.monotonic() + BLOCK_S
        while not release.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
        return real_answer(name, arguments)

    monkeypatch.setattr(taskset, "answer", answer)
    yield release
    release.set()


def test_a_tool_call_that_blocks_is_cut_dropped_and_named(tiny_model_dir, tmp_path, blocked):
    import tool_calc.taskset as taskset

    env = load_env(EnvConfig(id="tool-calc", args={"num_tasks": 1}, call_timeout_s=TIMEOUT_S), 0, tmp_path)
    task, tok = env.train[0], AutoTokenizer.from_pretrained(tiny_model_dir)
    try:
        r = asyncio.run(rollout(ScriptedPolicy(tok, [RIGHT, "1660"]), tok, "tool-calc", task, SamplingParams(max_tokens=128),
                                512, 3, 0, asyncio.Semaphore(1), env.box))
    finally:
        blocked.set()
    line = next(n for n, text in enumerate(Path(taskset.__file__).read_text().splitlines(), 1)
                if "result = answer(name, arguments)" in text)
    assert r.dropped == "timeout", (r.dropped, r.reward, r.turns)
    assert r.dropped_detail == (f"tool-calc's tool calc did not return in {TIMEOUT_S:g} s (task {task.data.id}): "
                                f"stuck in tool_calc/taskset.py:{line} in call")
    assert env.box.timeouts == 1
    with pytest.raises(EnvError, match=r"every rollout of tool-calc in step 0 timed out \(1 of 1\): tool-calc's tool "
                                       r"calc did not return .* \(a tool that is only slow needs a larger call_timeout_s\)"):
        stop_if_every_call_timed_out("step 0", [r], {"tool-calc"})


def test_a_lift_draw_whose_tool_blocks_is_invalid_and_not_waited_for(tiny_model_dir, tmp_path, blocked):
    """The distill step's hint-lift draws (orchestrator/lift_sampling.py, `lift_samples`) check each drawn turn in
    a fresh tool session of the rollout's task: in the rollout's CallBox, so a blocked tool makes that draw invalid
    after call_timeout_s. Before, the session was opened and called on the orchestrator's loop: each check waited
    out BLOCK_S and, the tool then answering, came back valid."""
    from composer_prime.env_runtime.error_sites import ErrorSite
    from composer_prime.orchestrator.lift_sampling import LiftSampler
    from composer_prime.orchestrator.rollouts import Rollout

    env = load_env(EnvConfig(id="tool-calc", args={"num_tasks": 1}, call_timeout_s=TIMEOUT_S), 0, tmp_path)
    task, tok = env.train[0], AutoTokenizer.from_pretrained(tiny_model_dir)
    tools = asyncio.run(task.open_session()).tools
    r = Rollout("tool-calc", task, [1], tools=tools, box=env.box)
    policy = ScriptedPolicy(tok, [RIGHT] * 4)  # 2 seeds x (hint, plain): every draw a well-formed call of calc
    try:
        draws = asyncio.run(LiftSampler(policy, tok, k=2, max_tokens=128).draw(r, ErrorSite(0, "unknown_tool", ""), [1], [2], 0))
    finally:
        blocked.set()
    assert (draws.hint, draws.plain) == ([False, False], [False, False])  # each call cut, so no draw counts as valid
    assert env.box.timeouts == 4

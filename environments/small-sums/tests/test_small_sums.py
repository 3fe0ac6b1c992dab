import asyncio

import pytest
import verifiers.v1 as vf
from pydantic import ValidationError
from small_sums.taskset import SmallSumsConfig, SmallSumsTaskset, last_integer


def _score(task, reply: str) -> tuple[float, dict]:
    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        root_reply=reply,
    )
    asyncio.run(task.score(trace))
    return trace.reward, trace.metrics


def test_loads_by_id_through_verifiers():
    taskset = vf.load_taskset(SmallSumsConfig(id="small-sums", num_tasks=5))
    assert isinstance(taskset, SmallSumsTaskset)
    tasks = list(taskset)
    assert len(tasks) == 5 and tasks[0].data.system_prompt is None  # the model's own default system prompt
    assert tasks[0].data.prompt.endswith("? Reply with the number only.")


def test_reward_reads_the_last_integer():
    assert [last_integer(t) for t in ("7", "3 + 4 = 7.", "7 or 8", "no number", "-2")] == [7, 7, 8, None, -2]
    task = list(SmallSumsTaskset(SmallSumsConfig(num_tasks=1)))[0]
    assert (task.data.prompt, task.data.answer) == ("What is 1 + 5? Reply with the number only.", "6")
    assert _score(task, "6") == (1.0, {"number_only": 1.0})
    assert _score(task, " 1 + 5 = 6.") == (1.0, {"number_only": 0.0})
    assert _score(task, "It is 6, or 7") == (0.0, {"number_only": 0.0})  # two answers: the last counts
    assert _score(task, "1 + 5 is") == (0.0, {"number_only": 0.0})  # cut before its answer
    assert _score(task, "six") == (0.0, {"number_only": 0.0})


def test_splits_are_disjoint_and_deterministic():
    train = {t.data.prompt for t in SmallSumsTaskset(SmallSumsConfig(num_tasks=2000))}
    held = [t.data.prompt for t in SmallSumsTaskset(SmallSumsConfig(split="eval", num_tasks=200))]
    assert (len(train), len(held)) == (81 - 24, 24) and not train & set(held)
    assert held == [t.data.prompt for t in SmallSumsTaskset(SmallSumsConfig(split="eval"))]
    assert held != [t.data.prompt for t in SmallSumsTaskset(SmallSumsConfig(split="eval", seed=1))]


@pytest.mark.parametrize("args", [{"held_out": 0}, {"held_out": 81}, {"max_operand": 0}])
def test_bad_config_is_refused_before_any_task_is_built(args):
    with pytest.raises(ValidationError, match="held_out must be between"):
        SmallSumsConfig(**args)

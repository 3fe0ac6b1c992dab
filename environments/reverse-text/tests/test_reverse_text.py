import asyncio

import verifiers.v1 as vf
from reverse_text.taskset import ReverseTextConfig, ReverseTextTaskset, similarity


def _score(task, reply: str) -> float:
    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        root_reply=reply,
    )
    asyncio.run(task.score(trace))
    return trace.reward


def test_loads_by_id_through_verifiers():
    taskset = vf.load_taskset(ReverseTextConfig(id="reverse-text", num_tasks=5))
    assert isinstance(taskset, ReverseTextTaskset)
    tasks = list(taskset)
    assert len(tasks) == 5 and tasks[0].data.system_prompt == "Reverse the letters."


def test_reward_pins():
    assert similarity("c b a", "c b a") == 1.0
    assert similarity("c b", "c b a") == 2 / 3
    assert similarity("a b c", "c b a") == 1 / 3
    assert similarity("", "a") == 0.0
    task = list(ReverseTextTaskset(ReverseTextConfig(num_tasks=1)))[0]
    assert _score(task, task.data.answer) == 1.0
    assert _score(task, "") == 0.0


def test_splits_are_disjoint_and_deterministic():
    train = {t.data.prompt for t in ReverseTextTaskset(ReverseTextConfig(num_tasks=2000))}
    held = [t.data.prompt for t in ReverseTextTaskset(ReverseTextConfig(split="eval", num_tasks=200))]
    assert not train & set(held)
    again = [t.data.prompt for t in ReverseTextTaskset(ReverseTextConfig(split="eval", num_tasks=200))]
    assert held == again

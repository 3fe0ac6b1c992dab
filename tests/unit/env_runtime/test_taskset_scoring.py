"""Scoring a reply in-process (env_runtime/tasksets.score): the trace's task record and agent are built
once and copied per score (the orchestrator scores every rollout); the rewards and metrics must stay
those of a trace built from scratch."""

import asyncio
import random

import verifiers.v1 as vf

from composer_prime.env_runtime import tasksets
from composer_prime.env_runtime.tasksets import load_tasks, score


async def from_scratch(task, reply: str) -> tuple[float, dict]:
    trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     agent=vf.AgentInfo(config=vf.AgentConfig()), root_reply=reply)
    await task.score(trace)
    return trace.reward, {k: v for k, v in trace.metrics.items() if v is not None}


def test_scores_are_those_of_a_fresh_trace():
    tasks = load_tasks("reverse-text", {"num_tasks": 50})
    rng = random.Random(0)

    async def both():
        for _ in range(200):
            task = tasks[rng.randrange(len(tasks))]
            reply = " ".join(rng.choice("abcdefgh") for _ in range(rng.randrange(8)))
            assert await score(task, reply) == await from_scratch(task, reply)

    asyncio.run(both())


def test_each_task_has_its_own_record_and_each_trace_its_own_copy():
    a, b = load_tasks("reverse-text", {"num_tasks": 2})
    (ra, agent1), (ra2, agent2), (rb, _) = tasksets._trace_parts(a), tasksets._trace_parts(a), tasksets._trace_parts(b)
    assert ra.data is a.data and rb.data is b.data and (ra.key, ra.hash) == (a.key, a.hash) and ra.key != rb.key
    assert ra is not ra2 and agent1 is not agent2  # a reward that changes its trace's record changes no other trace's
    c = load_tasks("reverse-text", {"num_tasks": 3})[2]
    tasksets._traced[id(c)] = (a, ra)  # another task once had this id (it was freed): its record is not c's
    assert tasksets._trace_parts(c)[0].data is c.data

"""Our environments as OpenEnv environments, in-process (hub/openenv_env.py): a task without tools
serves `answer` alone and its reward is the Task's own (reverse-text's partial credit); a tool
that says it is done ends the episode, scored with the session as the reward's runtime; the
step that ends it carries the reward once; and what cannot be served is refused up front.
The real server and OpenEnv's clients: tests/integration/test_env_serve.py."""

import asyncio

import pytest
import verifiers.v1 as vf
from openenv.core.env_server.mcp_types import CallToolAction

from composer_prime.env_runtime.tasksets import load_tasks
from composer_prime.hub.openenv_env import Served, TaskEnvironment, session_tools

FINISH = {"type": "function", "function": {"name": "finish", "description": "end the episode",
                                           "parameters": {"type": "object", "properties": {}}}}


class CountingSession:
    """A tool session whose `finish` says done; the reward counts the calls it saw."""

    def __init__(self, tools: list[dict]) -> None:
        self.tools, self.calls, self.closed = tools, 0, False

    async def call(self, name: str, arguments: dict) -> dict:
        self.calls += 1
        return {"content": "finished" if name == "finish" else "ok", "is_error": False, "done": name == "finish"}

    async def close(self) -> None:
        self.closed = True


class CountingTask(vf.Task[vf.TaskData]):
    tools = [FINISH]
    opened: list[CountingSession] = []

    async def open_session(self) -> CountingSession:
        self.opened.append(CountingSession(self.tools))
        return self.opened[-1]

    @vf.reward(weight=1.0)
    async def calls(self, trace: vf.Trace, runtime: CountingSession) -> float:
        return float(runtime.calls) + float(trace.last_reply == "")  # the session ended it: scored with no reply


def counting_task(tools: list[dict] | None = None) -> CountingTask:
    task = CountingTask(vf.TaskData(id="t-0", prompt="go"), vf.TaskConfig())
    if tools is not None:
        task.tools = tools
    return task


def step(env: TaskEnvironment, name: str, **arguments):
    return asyncio.run(env.step_async(CallToolAction(tool_name=name, arguments=arguments)))


def served(name: str, tasks: list) -> TaskEnvironment:
    return TaskEnvironment(Served(name, tasks, asyncio.run(session_tools(tasks)), "train"))


def test_a_task_without_tools_serves_answer_alone_and_scores_with_its_own_reward():
    tasks = load_tasks("reverse-text", {"num_tasks": 3})
    env = served("reverse-text", tasks)
    assert [t["function"]["name"] for t in env.served.tools] == ["answer"]
    start = asyncio.run(env.reset_async(index=1))
    assert start.task_id == tasks[1].data.id and start.messages[-1]["content"] == tasks[1].data.prompt
    letters = tasks[1].data.answer.split()
    half = " ".join(letters[: len(letters) // 2])
    scored = step(env, "answer", text=half)  # reverse-text's LCS: the first half of the answer
    assert (scored.done, scored.reward) == (True, (len(letters) // 2) / len(letters))
    assert scored.metadata["metrics"] == {"exact_match": 0.0}
    assert asyncio.run(env.reset_async(seed=4)).index == 1  # seed 4 of 3 tasks
    assert step(env, "answer", text=tasks[1].data.answer).reward == 1.0


def test_a_tool_that_says_done_ends_the_episode_and_the_reward_comes_once():
    env = served("counting", [counting_task()])
    asyncio.run(env.reset_async(index=0))
    first = step(env, "finish")
    assert (first.done, first.reward) == (True, 2.0)  # one call, scored with an empty reply
    assert first.result.data == {"content": "finished", "is_error": False, "done": True, "reward": 2.0}
    assert CountingTask.opened[-1].closed  # scored, then closed
    again = step(env, "finish")
    assert (again.done, again.reward, again.result.data["is_error"]) == (True, 0.0, True)
    assert CountingTask.opened[-1].calls == 1  # the closed session was not called again


def test_calls_before_reset_and_bad_answers_are_the_tools_errors():
    env = served("counting", [counting_task()])
    assert step(env, "finish").result.data["content"] == "no task yet: reset first"
    asyncio.run(env.reset_async(index=0))
    bad = step(env, "answer", reply="x")
    assert (bad.done, bad.reward, bad.result.data["content"]) == (
        False, 0.0, "answer takes one argument, 'text': the final reply as a string")
    with pytest.raises(ValueError, match="index 1 is out of range: counting serves 1 tasks"):
        asyncio.run(env.reset_async(index=1))


def test_what_cannot_be_served_is_refused_up_front():
    shadow = {"type": "function", "function": {"name": "answer", "parameters": {"type": "object"}}}
    with pytest.raises(ValueError, match="has a tool named 'answer'"):
        asyncio.run(session_tools([counting_task([shadow])]))
    reserved = {"type": "function", "function": {"name": "reset", "parameters": {"type": "object"}}}
    with pytest.raises(ValueError, match="reserved"):
        served("counting", [counting_task([reserved])])

"""`composer-prime env serve tool-calc` as a real process, driven by OpenEnv's own clients
(`GenericEnvClient` over `/ws`, `MCPToolClient` over `/mcp` + `/ws`) through the real protocol:
the gold answer scores exactly 1 and a wrong one 0 (tool-calc's own `@vf.reward`), the tools are
listed with the schemas tool-calc gives, episodes of two connections stay apart, one session
beyond `--max-concurrent-envs` is refused with OpenEnv's CAPACITY_REACHED, a server with keys
answers only clients that send its token, and a port in use is one line, exit 2. Feature
Deletion served the same way: its sandbox tools are the MCP tools, and writing the task's own
solution through them before `submit` scores 1 where submitting the broken tree scores 0.

The gold answers are computed here from each prompt with tool-calc's own arithmetic, never read
from the server."""

import json
import socket
import subprocess
import sys

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient
from tool_calc.taskset import CALC_SCHEMA, evaluate

from tests.conftest import ROOT
from tests.integration.conftest import ENV_SERVE, serve_env, stop
from tests.support import forkserver
from tests.support.bad_input import run_bad_input

TASKS = ["--args", '{"split": "eval", "num_tasks": 4}']
MINILIB = ROOT / "environments" / "feature-deletion" / "tests" / "fixtures" / "minilib"


def serve(*extra: str) -> tuple[subprocess.Popen, str]:
    return serve_env("tool-calc", *TASKS, *extra)


@pytest.fixture(scope="module")
def server():
    proc, url = serve("--max-concurrent-envs", "2")
    yield url
    stop(proc)


def call(name: str, **arguments) -> dict:
    return {"type": "call_tool", "tool_name": name, "arguments": arguments}


def question(observation) -> str:
    """The user's question of a reset observation (a dict from GenericEnvClient, an object from MCPToolClient)."""
    messages = observation["messages"] if isinstance(observation, dict) else observation.messages
    return messages[-1]["content"]


def reply(step) -> dict:
    """Our tool's reply as it crossed the wire: {content, is_error, done, reward}."""
    return step.observation["result"]["structured_content"]


def test_generic_client_gold_answer_scores_1_and_a_wrong_one_0(server):
    with GenericEnvClient(base_url=server).sync() as env:
        start = env.reset(index=2)
        assert (start.observation["task_id"], start.observation["index"], start.done) == ("eval-2", 2, False)
        assert [m["role"] for m in start.observation["messages"]] == ["system", "user"]
        gold = str(evaluate(question(start.observation)))
        used = env.step(call("calc", expr=question(start.observation)))
        assert reply(used) == {"content": gold, "is_error": False, "done": False, "reward": None}
        assert (used.reward, used.done) == (0.0, False)
        scored = env.step(call("answer", text=gold))
        assert (scored.reward, scored.done) == (1.0, True)
        assert scored.metadata["metrics"] == {"calc_ok": 1.0}  # tool-calc's @vf.metric: the tool returned the answer
        after = env.step(call("answer", text=gold))  # the episode is over: no second reward
        assert (after.reward, after.done, reply(after)["is_error"]) == (0.0, True, True)

        wrong = env.reset(seed=5)  # seed 5 of 4 tasks: task 1
        assert wrong.observation["task_id"] == "eval-1"
        scored = env.step(call("answer", text=str(evaluate(question(wrong.observation)) + 1)))
        assert (scored.reward, scored.done) == (0.0, True)
        assert scored.metadata["metrics"] == {"calc_ok": 0.0}


def test_mcp_tool_client_lists_the_tools_with_their_schemas_and_scores(server):
    with MCPToolClient(base_url=server).sync() as env:
        tools = {t.name: t for t in env.list_tools()}
        assert sorted(tools) == ["answer", "calc"]
        assert tools["calc"].input_schema == CALC_SCHEMA["function"]["parameters"]
        assert tools["calc"].description == CALC_SCHEMA["function"]["description"]
        assert tools["answer"].input_schema["required"] == ["text"]

        prompt = question(env.reset(index=0).observation)
        gold = str(evaluate(prompt))
        # a wrong call is the tool's own error, in its reply (what a model reads), not a failed request
        assert env.call_tool("calc", expression=prompt) == {
            "content": "calc takes one argument, 'expr'; got ['expression']", "is_error": True, "done": False, "reward": None}
        assert env.call_tool("calc", expr=prompt)["content"] == gold
        assert env.call_tool("answer", text=gold)["reward"] == 1.0

        prompt = question(env.reset(index=3).observation)
        assert env.call_tool("answer", text=str(evaluate(prompt) - 1))["reward"] == 0.0


def test_sessions_stay_apart_and_one_beyond_max_concurrent_envs_gets_capacity_reached(server):
    a, b = GenericEnvClient(base_url=server).sync(), GenericEnvClient(base_url=server).sync()
    with a, b:
        qa, qb = question(a.reset(index=0).observation), question(b.reset(index=1).observation)
        assert qa != qb
        with pytest.raises(RuntimeError, match=r"\(code: CAPACITY_REACHED\)"):
            with GenericEnvClient(base_url=server).sync() as c:
                c.reset(index=2)
        # interleaved: each connection's answer is scored against its own task
        assert b.step(call("answer", text=str(evaluate(qb)))).reward == 1.0
        assert a.step(call("answer", text=str(evaluate(qa)))).reward == 1.0
    with GenericEnvClient(base_url=server).sync() as c:  # the slots are free again
        assert c.reset(index=2).observation["task_id"] == "eval-2"


def test_with_keys_only_a_client_sending_the_token_gets_an_episode(tmp_path):
    keys = tmp_path / "keys"
    forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", "keys", "make", "--out", str(keys)],
                   check=True, capture_output=True)
    token = (keys / "inference.token").read_text().strip()
    proc, url = serve("--auth.keys_dir", str(keys))
    try:
        assert httpx.get(f"{url}/schema").status_code == 401
        with pytest.raises(ConnectionError):
            with GenericEnvClient(base_url=url).sync() as env:
                env.reset(index=0)
        assert httpx.get(f"{url}/schema", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        with GenericEnvClient(base_url=url, headers={"Authorization": f"Bearer {token}"}).sync() as env:
            prompt = question(env.reset(index=0).observation)
            assert env.step(call("answer", text=str(evaluate(prompt)))).reward == 1.0
    finally:
        stop(proc)


def test_a_port_in_use_is_one_line_exit_2():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        run_bad_input("composer_prime.entrypoints.cli", [*ENV_SERVE[3:], "tool-calc", "--port", str(port)],
                      f"error: --port {port}: cannot listen on 127.0.0.1:{port}: Address already in use$")


def test_feature_deletion_served_with_its_sandbox_tools(tmp_path):
    tasks = tmp_path / "tasks"
    forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", "env", "build-tasks", "feature-deletion",
                    "--source", str(MINILIB), "--out", str(tasks), "--max-tasks", "1"], check=True, capture_output=True, timeout=600)
    (task,) = (tasks / "tasks").iterdir()
    (solution,) = [p for p in (task / "solution").rglob("*.py")]
    proc, url = serve_env("feature-deletion", "--args", json.dumps({"taskset_dir": str(tasks)}))
    try:
        with MCPToolClient(base_url=url, message_timeout_s=600).sync() as env:
            assert sorted(t.name for t in env.list_tools()) == sorted(
                ["list_dir", "read_file", "write_file", "edit", "grep", "run_tests", "submit", "answer"])
            assert env.reset(index=0).observation.task_id == task.name
            assert env.call_tool("submit")["reward"] == 0.0  # the body still raises NotImplementedError

            env.reset(index=0)  # a fresh working copy
            rel = solution.relative_to(task / "solution").as_posix()
            assert env.call_tool("write_file", path=rel, content=solution.read_text())["is_error"] is False
            assert env.call_tool("submit") == {"content": "Submitted. Your changes will now be scored.", "is_error": False,
                                               "done": True, "reward": 1.0}
    finally:
        stop(proc)

"""openenv-calc: the questions and the reward, and episodes through openenv's own app over `/ws`
(Starlette's in-process test client: the real server code, no socket)."""

import pytest
from starlette.testclient import TestClient

from openenv_calc.calc import evaluate, question, reward, split_of
from openenv_calc.server.app import app


def test_questions_are_deterministic_and_the_splits_disjoint():
    train = {question("train", s) for s in range(300)}
    held_out = {question("eval", s) for s in range(300)}
    assert question("train", 7) == question("train", 7) and len(train) > 250 and len(held_out) > 250
    assert not train & held_out and {split_of(a, b) for a, _, b in held_out} == {"eval"}
    assert all(10 <= a <= 99 and 10 <= b <= 99 for a, _, b in train | held_out)
    with pytest.raises(ValueError, match="split must be one of"):
        question("test", 0)


def test_calc_and_the_reward():
    assert evaluate("12 * 34") == 408 and evaluate(" 10 - 25 ") == -15
    with pytest.raises(ValueError, match="cannot evaluate '1 plus 2'"):
        evaluate("1 plus 2")
    assert reward(True, "408", 408) == 1.0 and reward(True, "41", 408) == 0.5 and reward(False, " 408\n", 408) == 0.5
    assert reward(False, "", 408) == 0.0


def step(ws, tool: str, arguments: dict) -> dict:
    ws.send_json({"type": "step", "data": {"type": "call_tool", "tool_name": tool, "arguments": arguments}})
    return ws.receive_json()["data"]


def test_an_episode_over_the_websocket_route():
    with TestClient(app) as client, client.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset", "data": {"seed": 3, "split": "eval"}})
        obs = ws.receive_json()["data"]["observation"]
        a, op, b = question("eval", 3)
        assert obs["question"] == f"{a} {op} {b}" and [m["role"] for m in obs["messages"]] == ["system", "user"]
        ws.send_json({"type": "step", "data": {"type": "list_tools"}})
        tools = ws.receive_json()["data"]["observation"]["tools"]
        assert [t["name"] for t in tools] == ["calc", "answer"]
        assert tools[0]["input_schema"]["required"] == ["expr"]
        value = str(evaluate(obs["question"]))
        first = step(ws, "calc", {"expr": obs["question"]})
        assert first["observation"]["result"]["content"][0]["text"] == value and (first["reward"], first["done"]) == (0.0, False)
        wrong = step(ws, "calculator", {"expr": "1 + 2"})
        assert wrong["observation"]["error"]["error_type"] == "tool_not_found" and not wrong["done"]
        last = step(ws, "answer", {"text": value})
        assert (last["reward"], last["done"]) == (1.0, True)  # the first call worked, the answer is right
        assert step(ws, "answer", {"text": value})["observation"]["error"]["message"].endswith("reset first")


def test_only_the_first_call_counts():
    with TestClient(app) as client, client.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset", "data": {"seed": 0}})
        obs = ws.receive_json()["data"]["observation"]
        assert step(ws, "calc", {"expression": "1 + 2"})["observation"]["error"]["error_type"] == "invalid_args"
        assert step(ws, "calc", {"expr": obs["question"]})["observation"]["error"] is None  # a second call works
        assert step(ws, "answer", {"text": str(evaluate(obs["question"]))})["reward"] == 0.5

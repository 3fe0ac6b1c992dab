"""tool-calc: the tool's answers and its specific errors, the splits, and scoring through the session."""

import asyncio

import pytest

from tool_calc.taskset import CalcSession, ToolCalcConfig, evaluate, questions


def call(name: str, arguments: dict) -> dict:
    return asyncio.run(CalcSession().call(name, arguments))


def test_calc_evaluates_exactly_one_binary_expression():
    assert evaluate("874 + 786") == 1660 and evaluate(" 12*34 ") == 408 and evaluate("10 - 25") == -15
    assert call("calc", {"expr": "12 * 34"}) == {"content": "408", "is_error": False, "done": False}


@pytest.mark.parametrize("name,arguments,message", [
    ("calculator", {"expr": "1 + 2"}, "unknown tool 'calculator': the only tool is 'calc'"),
    ("calc", {}, "calc takes one argument, 'expr'"),
    ("calc", {"expression": "1 + 2"}, "calc takes one argument, 'expr'; got ['expression']"),
    ("calc", {"expr": 3}, "'expr' must be a string, e.g. \"12 * 34\""),
    ("calc", {"expr": "1 plus 2"}, "cannot evaluate '1 plus 2': write integer, operator (+ - *), integer, e.g. '12 * 34'"),
    ("calc", {"expr": "1 + 2 + 3"}, "cannot evaluate '1 + 2 + 3'"),
])
def test_every_wrong_call_is_a_specific_tool_error(name, arguments, message):
    out = call(name, arguments)
    assert out["is_error"] and not out["done"] and out["content"].startswith(message)


def test_splits_are_disjoint_and_deterministic():
    train = questions(ToolCalcConfig(num_tasks=500))
    held_out = questions(ToolCalcConfig(split="eval"))
    assert len(held_out) == 200 and not set(train) & set(held_out)
    assert train == questions(ToolCalcConfig(num_tasks=500))


def test_reward_needs_the_right_reply_and_the_metric_reads_the_session():
    from composer_prime.orchestrator.envs import load_tasks, score

    task = load_tasks("tool-calc", {"num_tasks": 1})[0]
    session = CalcSession()
    asyncio.run(session.call("calc", {"expr": task.data.prompt}))
    assert asyncio.run(score(task, task.data.answer, session)) == (1.0, {"calc_ok": 1.0})
    assert asyncio.run(score(task, "12", CalcSession())) == (0.0, {"calc_ok": 0.0})

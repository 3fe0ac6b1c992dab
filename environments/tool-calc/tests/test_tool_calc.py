"""tool-calc: the tool's answers and its specific errors, the splits, and scoring through the session."""

import asyncio

import pytest

from tool_calc.taskset import CalcSession, ToolCalcConfig, ToolCalcData, ToolCalcTask, evaluate, questions


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
    from composer_prime.env_runtime.tasksets import load_tasks, score

    task = load_tasks("tool-calc", {"num_tasks": 1})[0]
    session = CalcSession()
    asyncio.run(session.call("calc", {"expr": task.data.prompt}))
    assert asyncio.run(score(task, task.data.answer, session)) == (1.0, {"calc_ok": 1.0})
    assert asyncio.run(score(task, "12", CalcSession())) == (0.0, {"calc_ok": 0.0})


QUESTION_CALL = '<tool_call>{"name": "calc", "arguments": {"expr": "874 + 786"}}</tool_call>'


def hint_for(kind: str, name: str | None = None, messages: list[dict] | None = None) -> str | None:
    from composer_prime.env_runtime.error_sites import ErrorSite
    from composer_prime.orchestrator.hints import HintContext

    task = ToolCalcTask(ToolCalcData(id="t", prompt="874 + 786", answer="1660"))
    return task.hint(ErrorSite(0, kind, "detail", name), HintContext(messages or [], "text", CalcSession.tools, task))


def test_hints_show_this_questions_call_and_never_the_unreturned_answer():
    assert hint_for("unknown_tool", "calculator") == f"The only tool is `calc`, not `calculator`: {QUESTION_CALL}"
    assert hint_for("parse") == f"Write the call as valid JSON inside the tags: {QUESTION_CALL}"
    for kind in ("bad_arguments", "tool_error"):
        assert hint_for(kind, "calc") == (
            f"`calc` takes one argument, `expr`, the expression as a string: {QUESTION_CALL}")
    not_yet = f"First call the tool, {QUESTION_CALL}, then reply with its result only."
    assert hint_for("format") == not_yet
    wrong_call = [{"role": "tool", "content": "42"}, {"role": "tool", "content": "error: cannot evaluate '1660'"}]
    assert hint_for("format", messages=wrong_call) == not_yet  # no message carries 1660 as the tool's result
    assert hint_for("format", messages=[{"role": "tool", "content": "1660"}]) == "Reply with the number only: 1660"
    assert hint_for("stalled") is None


def test_the_final_reply_rule_flags_anything_but_a_bare_integer():
    from composer_prime.env_runtime.turns import Turn
    from composer_prime.env_runtime.error_sites import ErrorSite, detect
    from composer_prime.env_runtime.tool_calls import parse_tool_call

    rules = ToolCalcTask(ToolCalcData(id="t", prompt="874 + 786", answer="1660")).error_rules
    called = Turn(QUESTION_CALL, "stop", call=parse_tool_call(QUESTION_CALL),
                  result={"content": "1660", "is_error": False, "done": False})

    def sites(reply: str, finish: str = "stop") -> list:
        return detect([called, Turn(reply, finish)], CalcSession.tools, rules)

    assert sites("The answer is 1660.") == [ErrorSite(1, "format", "the final reply must be the number only")]
    assert sites("1660.") == [ErrorSite(1, "format", "the final reply must be the number only")]
    assert sites(" 1660\n") == sites("-15") == sites("12") == []  # right or wrong, a number is the right format
    assert sites("The answer", finish="length") == []  # cut by the token limit: not the model's format
    assert detect([called], CalcSession.tools, rules) == []  # a turn with a call is not a final reply


def test_demonstrations_cli_writes_wrong_calls_and_never_held_out_questions(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "demos.jsonl"
    r = subprocess.run([sys.executable, "-m", "tool_calc.demos", "--out", str(out), "-n", "400", "--max-operand", "99"],
                       check=True, timeout=120, capture_output=True, text=True)
    assert r.stdout == f"wrote 400 demonstrations to {out}\n"  # a success says what it made, and where
    demos = [json.loads(ln)["messages"] for ln in out.read_text().splitlines()]
    assert len(demos) == 400 and all(m[-1]["role"] == "assistant" for m in demos)
    held_out = {f"{a} {op} {b}" for a, op, b in questions(ToolCalcConfig(split="eval", max_operand=99))}
    assert not {m[1]["content"] for m in demos} & held_out
    targets = [m[-1]["content"] for m in demos]
    wrong = [t for t in targets if t.startswith("<tool_call>") and '"calc", "arguments": {"expr"' not in t]
    hinted = [m for m in demos if len(m) == 4 and m[2]["role"] == "user"]
    assert 0.2 < len(wrong) / len(demos) < 0.6 and 0.1 < len(hinted) / len(demos) < 0.3
    recoveries = [m for m in demos if len(m) == 5 and m[3]["content"].startswith("error: ")]
    assert recoveries
    for m in recoveries:  # every wrong call's tool reply is the session's real error for it
        first = json.loads(m[2]["content"][len("<tool_call>"):-len("</tool_call>")])
        assert m[3]["content"] == "error: " + call(first["name"], first["arguments"])["content"]

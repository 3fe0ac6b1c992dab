"""Preference pairs from teachers' proposals: structural comparison, majority against the student,
no pair on a tie or a minority, who said what kept, and the circularity flag."""

from composer_prime.traces.pairs import family, key, make_pair
from composer_prime.traces.record import Step, action, tool_call


def call(name: str, args) -> dict:
    return action("", [tool_call("x", name, args)])


STUDENT = call("Read", {"file_path": "calc.py"})


def step(model: str = "claude-sonnet-4-5") -> Step:
    return Step(id="s.jsonl:4", messages=[{"role": "user", "content": "fix add"}], action=STUDENT, source="s.jsonl", line=4,
                meta={"model": model})


def test_actions_compare_by_structure():
    assert key(call("Edit", '{"b": 1, "a": 2}')) == key(call("Edit", {"a": 2, "b": 1}))  # argument order, string or dict
    assert key(call("Edit", {"a": 2})) != key(call("Edit", {"a": 3}))
    assert key(action("  The  Answer\nis 4 ", [])) == key(action("the answer is 4", []))
    assert key(action("4", [])) != key(call("calc", {"expr": "2+2"}))


def test_majority_against_the_student_makes_a_pair():
    edit = call("Edit", {"file_path": "calc.py", "old_string": "a - b", "new_string": "a + b"})
    proposals = {"big": edit, "mid": call("Edit", {"new_string": "a + b", "old_string": "a - b", "file_path": "calc.py"}),
                 "small": STUDENT}
    models = {"big": "gpt-5", "mid": "Qwen3-32B", "small": "claude-haiku-4-5"}
    pair = make_pair(step(), proposals, models)
    assert pair["agree"] == ["big", "mid"] and pair["chosen"][0]["tool_calls"][0]["function"]["name"] == "Edit"
    assert pair["rejected"] == [{"role": "assistant", "content": None, "tool_calls": STUDENT["tool_calls"]}]
    assert pair["prompt"] == [{"role": "user", "content": "fix add"}] and set(pair["proposals"]) == {"big", "mid", "small"}
    assert pair["circular"] is False  # the student's family (claude) is only in the minority
    assert make_pair(step("anthropic/claude-opus-4-1"), proposals, {**models, "mid": "claude-sonnet-4-5"})["circular"] is True


def test_no_pair_when_teachers_side_with_the_student_tie_or_are_too_few():
    other = call("Grep", {"pattern": "def add"})
    assert make_pair(step(), {"a": STUDENT, "b": STUDENT, "c": other}, {}) is None  # the majority agrees with the student
    assert make_pair(step(), {"a": other, "b": other, "c": call("Bash", {"command": "pytest"}),
                              "d": call("Bash", {"command": "pytest"})}, {}) is None  # two majorities: no verdict
    assert make_pair(step(), {"a": other}, {}) is None  # one teacher is not agreement (min_agree = 2)
    assert make_pair(step(), {"a": other}, {}, min_agree=1)["agree"] == ["a"]


def test_model_families():
    assert [family(m) for m in ("claude-sonnet-4-5", "openai/gpt-4o", "Qwen3-8B", None, "")] == ["claude", "gpt", "qwen", "", ""]


def test_a_call_written_in_the_text_is_the_same_call():
    """Our inference server as a teacher answers in the environments' text format; a recorded
    rollout carries the call both ways. Both are one call, and the dataset writes it once."""
    from composer_prime.traces.dataset import as_text

    text = '<tool_call>{"name": "calc", "arguments": {"expr": "12 + 3"}}</tool_call>'
    recorded = action(text, [tool_call("call_0", "calc", {"expr": "12 + 3"})])
    assert key(action(text, [])) == key(recorded) == key(call("calc", {"expr": "12 + 3"}))
    assert key(action(text.replace("12", "13"), [])) != key(recorded)
    assert key(action("<tool_call>{oops", [])) == ("text", "<tool_call>{oops")  # does not parse: compared as text
    assert as_text({"role": "assistant", **recorded})["content"] == text
    assert as_text({"role": "assistant", "content": None, "tool_calls": recorded["tool_calls"]})["content"] == text

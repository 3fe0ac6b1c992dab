"""OpenEnv `TrainingTrace` v1 exports to steps (traces/openenv_trace.py), on rollouts exported by
OpenEnv's own capture code (tests/support/openenv_capture.py): exact steps, histories, actions
and meta; both export shapes, one document over many lines or one per line; a turn the mask
leaves untrained skipped and counted; and a malformed export stopping the ingest in one line."""

import json

import pytest

from composer_prime.traces.ingest import IngestError, ingest
from tests.support.openenv_capture import ANSWER, CALC, RESULT, SYSTEM, USER, trace_entries_answer, training_trace

CALL_AS_HISTORY = {"role": "assistant", "content": None,  # what a teacher sees: no reasoning
                   "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "12 * 34"}'}}]}


def test_a_training_trace_document_is_one_step_per_agent_call(tmp_path):
    path = tmp_path / "rollout.json"
    path.write_text(json.dumps(training_trace(), indent=2))  # many lines: read as one document
    steps, rows, warnings, total = ingest([path])
    assert rows == [{"file": str(path), "format": "openenv", "records": 1, "steps": 2}]  # the title call is not the agent's
    assert warnings == [] and total["steps"] == 2
    call, answer = steps
    assert [s.id for s in steps] == ["rollout.json:1:0", "rollout.json:1:1"]
    assert call.messages == [SYSTEM, USER] and call.tools == [CALC]
    assert call.action == {"content": "", "tool_calls": CALL_AS_HISTORY["tool_calls"], "thinking": "The tool computes it."}
    assert call.meta == {"node_id": "n1", "model": "tiny", "finish_reason": "tool_calls"}
    assert answer.messages == [SYSTEM, USER, CALL_AS_HISTORY, RESULT]
    assert answer.action == {"content": ANSWER["content"], "tool_calls": [], "thinking": ""}
    assert (answer.error, answer.line, answer.source) == (None, 1, str(path))


def test_trace_entries_answers_one_per_line(tmp_path):
    path = tmp_path / "sessions.jsonl"
    path.write_text("".join(json.dumps(trace_entries_answer(s)) + "\n" for s in ("r-1", "r-2")) + "{not json\n")
    steps, rows, _, _ = ingest([path])
    assert rows == [{"file": str(path), "format": "openenv", "records": 2, "steps": 4, "skipped/truncated": 1}]
    assert [s.id for s in steps] == ["sessions.jsonl:1:0", "sessions.jsonl:1:1", "sessions.jsonl:2:0", "sessions.jsonl:2:1"]
    assert [s.meta["session"] for s in steps] == ["r-1", "r-1", "r-2", "r-2"]
    assert steps[3].messages == [SYSTEM, USER, CALL_AS_HISTORY, RESULT]


def test_a_turn_the_mask_leaves_untrained_is_skipped(tmp_path):
    trace = training_trace()
    first = trace["turns"][0]
    first["loss_mask"] = [0] * len(first["loss_mask"])  # still a valid TrainingTrace: context only
    (tmp_path / "t.json").write_text(json.dumps(trace))
    steps, rows, _, _ = ingest([tmp_path / "t.json"])
    assert [s.meta["node_id"] for s in steps] == ["n2"]
    assert rows[0]["skipped/masked"] == 1 and rows[0]["steps"] == 1


@pytest.mark.parametrize("spoil, message", [
    (lambda t: t["turns"][1].update(loss_mask=t["turns"][1]["loss_mask"][:-1]),
     "not an OpenEnv TrainingTrace v1 (turns.1: Value error, invalid training turn: [FATAL] length_mismatch: "
     "loss_mask must cover prompt plus completion)"),
    (lambda t: t["turns"][0].update(per_token_logps=[-0.5, 0.25, -0.125]),
     "not an OpenEnv TrainingTrace v1 (turns.0: Value error, invalid training turn: [FATAL] positive_logprob: "
     "turn 0: logprobs must not be positive)"),
    (lambda t: t.update(schema_version=2), "not an OpenEnv TrainingTrace v1 (schema_version: Input should be 1)"),
    (lambda t: t["turns"].append(dict(t["turns"][0])),
     "not an OpenEnv TrainingTrace v1 (Value error, training trace contains duplicate node_ids)"),
])
def test_a_malformed_training_trace_stops_the_ingest_in_one_line(tmp_path, spoil, message):
    trace = training_trace()
    spoil(trace)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(trace))
    with pytest.raises(IngestError) as e:
        ingest([path])
    assert str(e.value) == f"{path}:1: {message}"


def test_a_malformed_trace_entries_answer_names_its_line(tmp_path):
    answer = trace_entries_answer()
    del answer["entries"][1]["metadata"]["node_id"]
    path = tmp_path / "entries.jsonl"
    path.write_text(json.dumps(trace_entries_answer("ok")) + "\n" + json.dumps(answer) + "\n")
    with pytest.raises(IngestError) as e:
        ingest([path])
    assert str(e.value) == f"{path}:2: not an OpenEnv trace_entries answer (an entry lacks 'node_id')"

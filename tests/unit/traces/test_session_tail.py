"""What a Claude Code session file holds after its last message does not choose the session's leaf
(issue 24: a record of a type the ingester does not know, with a `uuid` and no `parentUuid`,
written last, made every message an abandoned branch and the session 0 steps). The leaf is the
last message written, or the message a later `summary` names; every other record is counted by
its type. Session files are written into tmp_path: tests/fixtures/traces/ is pinned elsewhere."""

import json
from pathlib import Path

import pytest

from composer_prime.traces.ingest import ingest

SESSION = "sess-tail"


def user(uuid: str, parent: str | None, content: object) -> dict:
    return {"type": "user", "uuid": uuid, "parentUuid": parent, "isSidechain": False, "userType": "external",
            "sessionId": SESSION, "version": "2.0.74", "message": {"role": "user", "content": content}}


def assistant(uuid: str, parent: str, msg_id: str, blocks: list[dict]) -> dict:
    return {"type": "assistant", "uuid": uuid, "parentUuid": parent, "isSidechain": False, "sessionId": SESSION,
            "version": "2.0.74", "message": {"id": msg_id, "type": "message", "role": "assistant",
                                             "model": "claude-sonnet-4-5", "content": blocks}}


# u1 -> a1 (a call) -> u2 (its result) -> a2x (abandoned: the user edited) / a2 (the session goes on)
CONVERSATION = [
    user("u1", None, "Add a multiply function."),
    assistant("a1", "u1", "msg_1", [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "calc.py"}}]),
    user("u2", "a1", [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "def add(a, b):\n    return a + b\n"}]),
    assistant("a2x", "u2", "msg_2x", [{"type": "text", "text": "I'll rewrite the file."}]),
    assistant("a2", "u2", "msg_2", [{"type": "text", "text": "Added multiply."}]),
]

# every kind of record seen after the last message; (record, the skipped/<type> it counts as)
TAIL = {
    "unknown_root": ({"type": "agent-name", "uuid": "n1", "parentUuid": None, "sessionId": SESSION, "name": "calc"},
                     "skipped/agent-name"),
    "unknown_child": ({"type": "pr-link", "uuid": "w1", "parentUuid": "a2", "isSidechain": False, "sessionId": SESSION,
                       "url": "https://example.invalid/pr/1"}, "skipped/pr-link"),
    "untyped_root": ({"uuid": "z1", "parentUuid": None, "sessionId": SESSION}, "skipped/untyped"),
    "summary_valid": ({"type": "summary", "summary": "Add multiply", "leafUuid": "a2"}, "skipped/summary"),
    "summary_dangling": ({"type": "summary", "summary": "From another file", "leafUuid": "not-in-this-file"},
                         "skipped/summary"),
    "snapshot": ({"type": "file-history-snapshot", "messageId": "m9", "snapshot": {"trackedFileBackups": {}},
                  "isSnapshotUpdate": True}, "skipped/file-history-snapshot"),
    "system_child": ({"type": "system", "subtype": "turn_duration", "uuid": "s1", "parentUuid": "a2", "isSidechain": False,
                      "sessionId": SESSION, "durationMs": 1200}, "skipped/system"),
    "system_root": ({"type": "system", "subtype": "local_command", "uuid": "s2", "parentUuid": None, "isSidechain": False,
                     "sessionId": SESSION, "content": "/cost"}, "skipped/system"),
    "progress_root": ({"type": "progress", "uuid": "p1", "parentUuid": None, "sessionId": SESSION,
                       "data": {"type": "hook_progress"}}, "skipped/progress"),
    "queue_operation": ({"type": "queue-operation", "operation": "dequeue", "sessionId": SESSION}, "skipped/queue-operation"),
}


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def counts(path: Path) -> tuple[list[str], dict]:
    steps, rows, _, _ = ingest([path])
    assert len(rows) == 1
    return [s.id for s in steps], {k: v for k, v in rows[0].items() if k not in ("file", "format")}


@pytest.mark.parametrize("kind", sorted(TAIL))
def test_one_record_after_the_last_message(tmp_path, kind):
    record, skipped = TAIL[kind]
    ids, row = counts(write(tmp_path / f"{SESSION}.jsonl", CONVERSATION + [record]))
    assert ids == [f"{SESSION}.jsonl:2", f"{SESSION}.jsonl:5"]
    assert row == {"records": 6, "steps": 2, "skipped/abandoned_branch": 1, skipped: 1}


def test_every_kind_of_record_after_the_last_message(tmp_path):
    tail = [record for record, _ in TAIL.values()]
    ids, row = counts(write(tmp_path / f"{SESSION}.jsonl", CONVERSATION + tail + tail))
    assert ids == [f"{SESSION}.jsonl:2", f"{SESSION}.jsonl:5"]
    assert row == {"records": 25, "steps": 2, "skipped/abandoned_branch": 1, "skipped/agent-name": 2, "skipped/pr-link": 2,
                   "skipped/untyped": 2, "skipped/summary": 4, "skipped/file-history-snapshot": 2, "skipped/system": 4,
                   "skipped/progress": 2, "skipped/queue-operation": 2}


def test_a_later_summary_names_the_leaf(tmp_path):
    # written after a2, a summary naming a2x says the session ended there: a2 is the abandoned one
    named = {"type": "summary", "summary": "Rewrite calc.py", "leafUuid": "a2x"}
    ids, row = counts(write(tmp_path / f"{SESSION}.jsonl", CONVERSATION + [named, TAIL["unknown_root"][0]]))
    assert ids == [f"{SESSION}.jsonl:2", f"{SESSION}.jsonl:4"]
    assert row == {"records": 7, "steps": 2, "skipped/abandoned_branch": 1, "skipped/summary": 1, "skipped/agent-name": 1}


def test_an_earlier_summary_does_not_cut_the_session(tmp_path):
    # a resumed session's file opens with the summary of where it was; the messages after it go on
    opening = {"type": "summary", "summary": "Add multiply", "leafUuid": "u1"}
    ids, row = counts(write(tmp_path / f"{SESSION}.jsonl", [opening] + CONVERSATION + [TAIL["system_root"][0]]))
    assert ids == [f"{SESSION}.jsonl:3", f"{SESSION}.jsonl:6"]
    assert row == {"records": 7, "steps": 2, "skipped/abandoned_branch": 1, "skipped/summary": 1, "skipped/system": 1}

"""Trace ingest on hand-written fixtures holding every trap of the formats (tests/fixtures/traces/):
exact counts per file and reason, the steps' histories, actions and error marks, compaction,
sidechains, sub-agent files skipped or kept, and OpenAI chat logs."""

import json
from pathlib import Path


from composer_prime.traces.ingest import ingest
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "traces"
CLAUDE = FIXTURES / "claude" / "-home-dev-calc"


def by_file(rows: list[dict]) -> dict[str, dict]:
    return {Path(r["file"]).name: r for r in rows}


def test_claude_code_session_every_trap_counted():
    steps, rows, warnings, total = ingest([FIXTURES / "claude"])
    row = by_file(rows)["sess-1.jsonl"]
    assert {k: v for k, v in row.items() if k not in ("file", "format")} == {
        "records": 19, "steps": 4, "merged_lines": 2, "skipped/summary": 1, "skipped/file-history-snapshot": 1,
        "skipped/system": 1, "skipped/pr-link": 1, "skipped/api_error": 1, "skipped/abandoned_branch": 2,
        "skipped/sidechain": 2, "skipped/truncated": 1, "skipped/not_utf8": 1}
    assert total["skipped_files/subagent"] == 2  # agent-*.jsonl beside the session and under sess-1/subagents/
    assert warnings == ["sess-1.jsonl: Claude Code version 3.0.1 is outside the tested 1.0-2.1; read it as the tested ones"]
    s1 = [s for s in steps if s.id.startswith("sess-1.jsonl:")]
    assert [s.id for s in s1] == ["sess-1.jsonl:4", "sess-1.jsonl:10", "sess-1.jsonl:14", "sess-1.jsonl:18"]
    first, read, edit, final = s1
    # one API response over three lines: thinking kept in the action, never in what teachers see
    assert first.action["content"] == "I'll run the tests." and first.action["thinking"] == "The user wants the test suite run first."
    assert first.action["tool_calls"][0]["function"] == {"name": "Bash", "arguments": '{"command": "pytest -q", "description": "run tests"}'}
    assert first.messages == [{"role": "user", "content": "Run the tests and fix the failure.\n[image]"}]
    assert [first.error, read.error, edit.error, final.error] == [True, False, False, None]
    # the abandoned branch ("I'll delete the failing test.") and the API error row are not in the history
    assert read.messages[1] == {"role": "assistant", "content": "I'll run the tests.", "tool_calls": first.action["tool_calls"]}
    assert read.messages[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "F.\n1 failed, 1 passed"}
    assert all("delete" not in json.dumps(s.messages) and "thinking" not in json.dumps(s.messages) for s in s1)
    assert edit.messages[4]["content"] == "def add(a, b):\n    return a - b\n"
    assert final.action == {"content": "Fixed: add now adds.", "tool_calls": [], "thinking": ""}
    assert final.meta == {"model": "claude-sonnet-4-5", "session": "sess-1"}


def test_compaction_starts_a_new_prefix():
    steps, rows, _, _ = ingest([CLAUDE / "sess-2.jsonl"])
    assert by_file(rows)["sess-2.jsonl"]["steps"] == 2
    before, after = steps
    assert before.messages == [{"role": "user", "content": "Add a multiply function."}]
    assert after.messages == [{"role": "user", "content": "Summary: the user asked for multiply; nothing is written yet."}]
    assert after.error is False


def test_sidechains_kept_as_their_own_traces():
    steps, rows, _, total = ingest([FIXTURES / "claude"], keep_sidechains=True)
    assert total["skipped_files/subagent"] == 0
    assert {n: r["steps"] for n, r in by_file(rows).items()} == {"sess-1.jsonl": 5, "sess-2.jsonl": 2, "agent-1a2b.jsonl": 1,
                                                                 "agent-77.jsonl": 1}
    side = [s for s in steps if s.id == "sess-1.jsonl:16"]
    assert len(side) == 1 and side[0].messages == [] and side[0].action["tool_calls"][0]["function"]["name"] == "Grep"


def test_openai_chat_logs():
    steps, rows, _, _ = ingest([FIXTURES / "openai" / "chats.jsonl"])
    assert by_file(rows)["chats.jsonl"] == {"file": str(FIXTURES / "openai" / "chats.jsonl"), "format": "openai", "records": 3,
                                            "steps": 3, "skipped/not_a_conversation": 1}
    call, answer, hi = steps
    assert call.tools[0]["function"]["name"] == "calc" and call.error is None  # OpenAI logs cannot say
    assert call.action["tool_calls"][0]["function"]["arguments"] == '{"expr": "12 * 34"}'
    assert [m["role"] for m in answer.messages] == ["system", "user", "assistant", "tool"]
    assert hi.action["thinking"] == "A greeting is asked for." and "reasoning_content" not in json.dumps(answer.messages)



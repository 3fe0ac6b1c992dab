"""OpenAI chat logs (one conversation per line: `messages`, optional `tools`) to `Step`s.

Also our own recorded rollouts (`orchestrator.record_traces`), which are this format plus
`reward`, `env`, `policy_version` on the line and `is_error` on tool messages (OpenAI's format
has no error field: other logs leave `Step.error` None). Every assistant message is a step; the
messages before it are its history. Vendor reasoning (`reasoning_content`) becomes the step's
thinking and is taken out of the history, like Claude Code's thinking blocks.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from composer_prime.traces.claude_code import read_entries
from composer_prime.traces.record import Step, action, assistant_message, tool_call

META_KEYS = ("reward", "env", "policy_version", "model", "task_id")


def looks_like(entry: dict) -> bool:
    return isinstance(entry.get("messages"), list)


def message_action(msg: dict) -> dict:
    """An OpenAI assistant message as a step's action: calls with canonical arguments, reasoning as thinking."""
    calls = [tool_call(c.get("id", ""), (c.get("function") or {}).get("name", ""), (c.get("function") or {}).get("arguments", "{}"))
             for c in msg.get("tool_calls") or []]
    for c in calls:  # canonical arguments when they are JSON (a string that is not stays as it came)
        try:
            c["function"]["arguments"] = json.dumps(json.loads(c["function"]["arguments"]), sort_keys=True, ensure_ascii=False)
        except (TypeError, ValueError):
            pass
    content = msg.get("content")
    if isinstance(content, list):  # content parts
        content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return action(content or "", calls, msg.get("reasoning_content") or "")


def history_message(msg: dict) -> dict:
    """A message as the history of a later step: an assistant's as its action shows it (no thinking),
    any other as it came, less the `is_error` mark OpenAI's format does not have."""
    if msg.get("role") == "assistant":
        return assistant_message(message_action(msg))
    return {k: v for k, v in msg.items() if k != "is_error"}


def parse(path: Path) -> tuple[list[Step], Counter, list[str]]:
    counts: Counter = Counter()
    steps: list[Step] = []
    for line, entry in read_entries(path, counts):
        if not looks_like(entry):
            counts["skipped/not_a_conversation"] += 1
            continue
        meta = {k: entry[k] for k in META_KEYS if k in entry}
        history: list[dict] = []
        pending: dict[str, Step] = {}
        last: Step | None = None  # an error for a call that did not parse (no tool_calls) is the last step's
        for i, msg in enumerate(entry["messages"]):
            if not isinstance(msg, dict) or "role" not in msg:
                counts["skipped/bad_message"] += 1
                continue
            if msg["role"] == "assistant":
                act = message_action(msg)
                step = Step(id=f"{path.name}:{line}:{i}", messages=list(history), action=act, tools=entry.get("tools"),
                            source=str(path), line=line, meta=dict(meta))
                steps.append(step)
                last = step
                history.append(assistant_message(act))
                pending.update({c["id"]: step for c in act["tool_calls"]})
                continue
            if msg["role"] == "tool" and "is_error" in msg and (maker := pending.get(msg.get("tool_call_id", ""), last)):
                maker.error = bool(maker.error) or bool(msg["is_error"])
            history.append(history_message(msg))
    counts["steps"] = len(steps)
    return steps, counts, []

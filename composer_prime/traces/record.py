"""The normalised trace record: one assistant step of a recorded agent session.

Every ingest format (Claude Code session JSONL, OpenAI chat logs, our own recorded rollouts)
becomes a stream of `Step`s, one per assistant turn, so replay never sees a source format:

    id        "<file name>:<line>" of the step's first line; unique within one ingest
    messages  the chat before the step, OpenAI format: system/user/assistant messages, an
              assistant's calls as `tool_calls` (arguments a JSON string), results as `tool`
              messages. What a teacher is shown: thinking is never part of it.
    tools     the tools offered, OpenAI function schemas, when the source says (else None)
    action    what the recorded agent did: {"content", "tool_calls", "thinking"}
    error     whether a tool result of this step's calls came back as an error (None: no calls,
              or the source cannot tell)
    source    the file and line the step came from; `meta` what else the source said of it
              (model, session, environment, reward, policy version)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Step:
    id: str
    messages: list[dict]
    action: dict
    tools: list[dict] | None = None
    error: bool | None = None
    source: str = ""
    line: int = 0
    meta: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, sort_keys=True)


def tool_call(call_id: str, name: str, arguments: dict | str) -> dict:
    """One OpenAI tool call; arguments canonical (sorted keys) so equal calls compare equal."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def action(content: str, tool_calls: list[dict], thinking: str = "") -> dict:
    return {"content": content, "tool_calls": tool_calls, "thinking": thinking}


def assistant_message(act: dict) -> dict:
    """The step as history for later steps: what a teacher sees (no thinking)."""
    msg: dict = {"role": "assistant", "content": act["content"] or None}
    if act["tool_calls"]:
        msg["tool_calls"] = act["tool_calls"]
    return msg


def write_steps(steps: list[Step], path: Path) -> None:
    """All steps to `path` (JSONL), written beside it first and renamed: never half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for s in steps:
            f.write(s.to_json() + "\n")
    tmp.replace(path)


def read_jsonl(path: Path) -> list[dict]:
    """Every line of a JSONL file, an object each; else ValueError in one line naming the file (and line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(rows[-1], dict):
            raise ValueError(f"{path}:{n}: not a JSON object")
    return rows


def read_steps(path: Path) -> list[Step]:
    """The steps `traces ingest` wrote; ValueError in one line naming the file otherwise."""
    try:
        return [Step(**row) for row in read_jsonl(path)]
    except TypeError as e:
        raise ValueError(f"{path}: not steps from `traces ingest` ({e})") from None

"""`orchestrator.record_traces = true`: every rollout of a run as an OpenAI chat log line.

The same format `composer-prime traces ingest` reads (traces/openai_chat.py), so a run's own
behaviour can be replayed by teachers like any recorded agent session. Each line: `messages`
(the task's opening, then each turn as an assistant message, its parsed call as `tool_calls`,
and the tool's reply as a `tool` message with `is_error`), `tools`, and what the run knew of
it: `reward`, `env`, `task_id`, `policy_version` (the oldest policy that sampled a turn), `step`.
Lines are appended as each step is built and flushed: a crash loses no finished step.
"""

from __future__ import annotations

import json
from pathlib import Path

from composer_prime.env_runtime.turns import tool_message
from composer_prime.orchestrator.rollouts import Rollout


def trace(r: Rollout, step: int) -> dict:
    messages = list(r.opening)
    for k, t in enumerate(r.turns):
        msg: dict = {"role": "assistant", "content": t.text}
        call_id = f"call_{k}"
        if t.call is not None and t.call.name:
            args = json.dumps(t.call.arguments or {}, sort_keys=True, ensure_ascii=False)
            msg["tool_calls"] = [{"id": call_id, "type": "function", "function": {"name": t.call.name, "arguments": args}}]
        messages.append(msg)
        if t.result is not None:
            messages.append({**tool_message(t.result), "tool_call_id": call_id, "is_error": bool(t.result.get("is_error"))})
    data = getattr(r.task, "data", None)
    return {"messages": messages, "tools": r.tools or None, "reward": r.reward, "env": r.env,
            "task_id": getattr(data, "id", None), "policy_version": r.weight_version, "step": step}


class TraceLog:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("a", encoding="utf-8")

    def write(self, step: int, rollouts: list[Rollout]) -> None:
        for r in rollouts:
            self.file.write(json.dumps(trace(r, step), ensure_ascii=False) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()

"""OpenEnv `TrainingTrace` v1 exports to `Step`s: an agent's model calls as OpenEnv's capture proxy
(`openenv.core.harness.capture`) recorded them, so the teachers replay them like any session.

A file holds one export, as JSON (a `.json` document, pretty-printed or not), or one per line:
- a `TrainingTrace` v1 (`to_training_trace(...).model_dump()`): `{"schema_version": 1, "turns": [...]}`,
  each turn one engine call: `prompt_token_ids`, `completion_token_ids`, `per_token_logps`,
  `loss_mask` (over prompt + completion), the raw `request` (`messages`, `tools`) and `response`
  (`choices[0].message`), `metadata` (`model`, ...);
- the proxy's `GET /sessions/{id}/trace_entries` answer: `{"session_id", "entries": [...]}`, the
  same turns with `node_id` in their metadata.

OpenEnv's own model (`openenv.core.harness.TrainingTrace`) validates every export: one that fails
is bad input for the whole command (a file and line, and why). Each turn is a step: its request's
messages are the history, its response message the action. The proxy already left out auxiliary
calls (title generators) and discarded retries; a turn whose completion the mask leaves wholly
untrained (control text the proxy wrote, not the model) is skipped and counted. Token ids are not
carried into the step: replay re-asks teachers from the messages.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from composer_prime.traces.claude_code import read_entries
from composer_prime.traces.openai_chat import history_message, message_action
from composer_prime.traces.record import Step


class MalformedTrace(ValueError):
    """An export that OpenEnv's TrainingTrace does not accept; the message is one line."""


def looks_like(entry: dict) -> bool:
    return ("schema_version" in entry and "turns" in entry) or ("entries" in entry and "session_id" in entry)


def document(path: Path) -> dict | None:
    """The file as one JSON export (a `.json` document may span lines), or None."""
    try:
        doc = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) and looks_like(doc) else None


def _trace(doc: dict, where: str) -> Any:
    """The export as OpenEnv's validated TrainingTrace."""
    try:
        from openenv.core.harness import TrainingTrace
        from pydantic import ValidationError
    except ImportError:
        raise MalformedTrace(f"{where}: reading OpenEnv traces needs the openenv extra (uv run --extra openenv ...)") from None
    try:
        if "entries" in doc:
            return TrainingTrace.from_entries(doc["entries"])
        return TrainingTrace.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(map(str, err["loc"]))
        raise MalformedTrace(f"{where}: not an OpenEnv TrainingTrace v1 ({loc + ': ' if loc else ''}{err['msg']})") from None
    except (KeyError, TypeError) as e:  # from_entries: an entry without metadata.node_id, or not a dict
        raise MalformedTrace(f"{where}: not an OpenEnv trace_entries answer (an entry lacks {e})") from None


def parse(path: Path) -> tuple[list[Step], Counter, list[str]]:
    """Steps of every export in `path`; MalformedTrace for one that OpenEnv's model refuses."""
    counts: Counter = Counter()
    whole = document(path)
    if whole is not None:
        counts["records"] += 1
    exports = [(1, whole)] if whole is not None else read_entries(path, counts)
    steps: list[Step] = []
    for line, doc in exports:
        if not looks_like(doc):
            counts["skipped/not_a_trace"] += 1
            continue
        trace = _trace(doc, f"{path}:{line}")
        for k, turn in enumerate(trace.turns):
            if not any(turn.loss_mask[len(turn.prompt_token_ids):]):
                counts["skipped/masked"] += 1
                continue
            choice = (turn.response.get("choices") or [{}])[0]
            reply, history = choice.get("message"), turn.request.get("messages")
            if not isinstance(reply, dict) or not isinstance(history, list):  # exported without its messages
                counts["skipped/no_messages"] += 1
                continue
            meta = {"node_id": turn.node_id, "model": turn.metadata.get("model"), "finish_reason": choice.get("finish_reason")}
            if "session_id" in doc:
                meta["session"] = doc["session_id"]
            steps.append(Step(id=f"{path.name}:{line}:{k}", messages=[history_message(m) for m in history if isinstance(m, dict)],
                              action=message_action(reply), tools=turn.request.get("tools") or None, source=str(path),
                              line=line, meta={key: v for key, v in meta.items() if v is not None}))
    counts["steps"] = len(steps)
    return steps, counts, []

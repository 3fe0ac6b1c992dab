"""Teachers' proposals for a step, turned into a preference pair where they outvote the student.

Actions are compared structurally, never as raw strings:

    key(action) = ("call", ((name, canonical arguments), ...))   when it calls tools
                  ("text", normalised text)                      otherwise

A call counts whether it came structured (`tool_calls`) or written in the text the way the
environments read it (`<tool_call>{...}</tool_call>`, what our own inference server returns as
a teacher): a recorded rollout carries both, a served checkpoint only the text.

(canonical arguments: the JSON parsed and re-dumped with sorted keys; normalised text: case
folded, whitespace collapsed). Where at least `min_agree` teachers propose the same key and it is
not the student's, the majority action is `chosen` and the student's is `rejected`, in TRL's
conversational preference format (`prompt`, `chosen`, `rejected` as message lists). Who said
what is kept. A pair is flagged `circular` when the recorded agent's model family is among the
agreeing teachers: the teacher then partly votes for its own habits, and the user may exclude it.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict

from composer_prime.env_runtime.tool_calls import parse_tool_call
from composer_prime.traces.record import Step, assistant_message


def _canonical_args(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return " ".join(str(arguments).split())


def key(action: dict) -> tuple:
    """What makes two actions the same: their calls (name and arguments), else their text."""
    calls = action.get("tool_calls") or []
    if calls:
        return ("call", tuple((c["function"]["name"], _canonical_args(c["function"].get("arguments", "{}"))) for c in calls))
    written = parse_tool_call(action.get("content") or "")
    if written is not None and written.error is None:
        return ("call", ((written.name, json.dumps(written.arguments, sort_keys=True, ensure_ascii=False)),))
    return ("text", " ".join((action.get("content") or "").casefold().split()))


def family(model: str | None) -> str:
    """A model's family: "claude-sonnet-4-5" -> "claude", "openai/gpt-4o" -> "gpt", "Qwen3-8B" -> "qwen"."""
    name = (model or "").rsplit("/", 1)[-1].casefold()
    m = re.match(r"[a-z]+", name)
    return m.group(0) if m else ""


def make_pair(step: Step, proposals: dict[str, dict], models: dict[str, str], min_agree: int = 2) -> dict | None:
    """The pair for `step` given each teacher's proposed action (None: no majority against the student).

    `models`: teacher name -> model id, for the circularity flag."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    for name, act in sorted(proposals.items()):
        groups[key(act)].append(name)
    student = key(step.action)
    best = max(groups.items(), key=lambda kv: (len(kv[1]), kv[0] != student), default=None)
    if best is None or len(best[1]) < min_agree or best[0] == student:
        return None
    agree = best[1]
    tied = [k for k, names in groups.items() if len(names) == len(agree) and k != best[0]]
    if tied:  # two different majorities: the teachers do not agree on what is right
        return None
    circular = family(step.meta.get("model")) != "" and family(step.meta.get("model")) in {family(models.get(t)) for t in agree}
    return {
        "id": step.id,
        "prompt": step.messages,
        "chosen": [assistant_message(proposals[agree[0]])],
        "rejected": [assistant_message(step.action)],
        "tools": step.tools,
        "agree": agree,
        "proposals": dict(sorted(proposals.items())),  # who said what
        "circular": circular,
        "source": f"{step.source}:{step.line}",
    }

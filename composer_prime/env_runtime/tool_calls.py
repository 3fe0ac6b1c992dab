"""Parse the tool call a model wrote: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

A malformed call is not an exception: it becomes an error the model sees as the tool's reply
(and an error site for the hint-distillation channel), so the episode can continue.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_OPEN = "<tool_call>"


def without_calls(text: str) -> str:
    """`text` with every `<tool_call>...</tool_call>` span removed (and its spacing tidied)."""
    return " ".join(_CALL.sub(" ", text).split())


@dataclass
class ParsedCall:
    name: str | None
    arguments: dict | None
    error: str | None  # why the call could not be made; None when name and arguments are usable


def parse_tool_call(text: str) -> ParsedCall | None:
    """The first tool call in `text`, or None when the reply makes no call (a final answer)."""
    m = _CALL.search(text)
    if m is None:
        if _OPEN in text:
            return ParsedCall(None, None, "the tool call is not closed: end it with </tool_call>")
        return None
    try:
        call = json.loads(m.group(1))
    except json.JSONDecodeError as e:
        return ParsedCall(None, None, f"the tool call is not valid JSON ({e.msg} at character {e.pos})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ParsedCall(None, None, 'the tool call needs a "name" string: {"name": ..., "arguments": {...}}')
    args = call.get("arguments", {})
    if not isinstance(args, dict):
        return ParsedCall(call["name"], None, f'"arguments" of {call["name"]} must be a JSON object')
    return ParsedCall(call["name"], args, None)

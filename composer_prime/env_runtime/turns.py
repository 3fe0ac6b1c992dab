"""One turn of an episode: what the model wrote, the tool call parsed from it and the tool's reply."""

from __future__ import annotations

from dataclasses import dataclass

from composer_prime.env_runtime.tool_calls import ParsedCall


@dataclass
class Turn:
    text: str
    finish_reason: str  # "stop" | "length"
    start: int = 0  # token-level samplers: this turn's model tokens are completion_ids[start:end]
    end: int = 0
    call: ParsedCall | None = None  # the tool call it made, if any
    result: dict | None = None  # the tool's reply {"content", "is_error", "done"}

    @property
    def error(self) -> str | None:
        """Why this turn's tool call failed (unparseable, unknown tool, bad arguments, tool error)."""
        if self.call is not None and self.call.error:
            return self.call.error
        return self.result["content"] if self.result and self.result.get("is_error") else None


def tool_message(result: dict) -> dict:
    return {"role": "tool", "content": ("error: " if result["is_error"] else "") + result["content"]}


def tool_metrics(turns: list[Turn]) -> dict[str, float]:
    calls = [t for t in turns if t.call is not None]
    return {"turns": float(len(turns)), "tool_calls": float(len(calls)),
            "tool_errors": float(sum(t.error is not None for t in calls))}

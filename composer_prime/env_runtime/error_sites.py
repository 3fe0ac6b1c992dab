"""Find the turns of a rollout that went wrong, and why: the error sites where the distill
channel inserts a hint and makes the hinted policy the teacher for that turn.

Each turn gets at most one site, from the first rule that matches, most specific cause first: a
call that does not parse, a tool that does not exist, arguments its schema rejects, and only
then the tool's own error reply (which for those three would just repeat the cause). An
environment appends rules of its own (e.g. a format rule for the final reply).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from composer_prime.env_runtime.turns import Turn


@dataclass(frozen=True)
class ErrorSite:
    turn: int  # index into the rollout's turns
    kind: str  # "parse" | "unknown_tool" | "bad_arguments" | "tool_error" | "format" | an environment's own
    detail: str  # the specific message the hint can quote
    name: str | None = None  # the tool the turn called, when its call parsed that far


Rule = Callable[[int, Turn, list[dict]], ErrorSite | None]  # (turn index, turn, tool schemas)


def tool_names(tools: list[dict]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def parse_error(k: int, turn: Turn, tools: list[dict]) -> ErrorSite | None:
    call = turn.call
    if call is not None and call.error and call.name is None:
        return ErrorSite(k, "parse", call.error)
    return None


def unknown_tool(k: int, turn: Turn, tools: list[dict]) -> ErrorSite | None:
    call, names = turn.call, tool_names(tools)
    if call is None or call.name is None or not names or call.name in names:
        return None
    return ErrorSite(k, "unknown_tool", f"unknown tool '{call.name}'; the tools are: {', '.join(names)}", call.name)


def bad_arguments(k: int, turn: Turn, tools: list[dict]) -> ErrorSite | None:
    call = turn.call
    if call is None or call.name is None:
        return None
    if call.arguments is None:  # the parser's finding ("arguments must be a JSON object"): needs no schema
        return ErrorSite(k, "bad_arguments", call.error or "arguments must be a JSON object", call.name)
    schema = next((t["function"].get("parameters") for t in tools if t["function"]["name"] == call.name), None)
    if schema is None:
        return None
    # all of them: a misspelt name is two errors ("'expr' is a required property", "'expresion'
    # was unexpected") and the hint needs both
    errors = [schema_message(e) for e in Draft202012Validator(schema).iter_errors(call.arguments)]
    return ErrorSite(k, "bad_arguments", "; ".join(errors), call.name) if errors else None


def schema_message(err: ValidationError) -> str:
    field = ".".join(map(str, err.absolute_path))
    message = " ".join(err.message.split())[:200]  # one line, bounded: the message may quote a long value
    return f"{field}: {message}" if field else message


def tool_error(k: int, turn: Turn, tools: list[dict]) -> ErrorSite | None:
    if turn.result is None or not turn.result.get("is_error"):
        return None
    return ErrorSite(k, "tool_error", turn.result["content"], turn.call.name if turn.call else None)


DEFAULT_RULES: tuple[Rule, ...] = (parse_error, unknown_tool, bad_arguments, tool_error)


def detect(turns: list[Turn], tools: list[dict], rules: Sequence[Rule] | None = None) -> list[ErrorSite]:
    """The error sites of one rollout, in turn order. `rules` are an environment's extra rules,
    tried after the defaults. Without schemas (`tools` empty) a name or arguments cannot be
    checked, so only the parser's findings and the tool's own errors count."""
    chain = (*DEFAULT_RULES, *(rules or ()))
    sites: list[ErrorSite] = []
    for k, turn in enumerate(turns):
        site = next((s for rule in chain if (s := rule(k, turn, tools)) is not None), None)
        if site is not None:
            sites.append(site)
    return sites


KINDS = ("parse", "unknown_tool", "bad_arguments", "tool_error", "format")  # always reported, 0 when absent


def site_counts(sites: list[ErrorSite]) -> dict[str, int]:
    return dict(Counter(s.kind for s in sites))


def site_metrics(sites: list[ErrorSite]) -> dict[str, float]:
    """Per-rollout metrics: every known kind (0 when absent, so means over rollouts are per rollout)."""
    counts = site_counts(sites)
    kinds = (*KINDS, *sorted(set(counts) - set(KINDS)))
    return {"error_sites": float(len(sites)), **{f"sites/{k}": float(counts.get(k, 0)) for k in kinds}}

"""The tool schemas, turn and error site that the hinter tests share, and helpers to ask a hinter once."""

import asyncio

from composer_prime.env_runtime.error_sites import ErrorSite
from composer_prime.orchestrator.hints import HintContext


CALC = {"type": "function", "function": {
    "name": "calc", "description": "integer arithmetic",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}

LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "search",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["query", "limit"]}}}

TURN = '<tool_call>{"name": "calculator", "arguments": {"expr": "874 + 786"}}</tool_call>'
UNKNOWN = ErrorSite(0, "unknown_tool", "unknown tool 'calculator'; the tools are: calc", "calculator")


def context(tools: list[dict] | None = None, task=None) -> HintContext:
    return HintContext([{"role": "user", "content": "874 + 786"}], TURN, [CALC] if tools is None else tools, task)


def hint(hinter, site: ErrorSite, ctx: HintContext | None = None) -> str | None:
    return asyncio.run(hinter(site, ctx or context()))

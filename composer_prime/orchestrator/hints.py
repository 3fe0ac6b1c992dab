"""Hints for error turns: the short text inserted before a turn that went wrong, so the same
policy, reading it, becomes the teacher for that turn.

A hinter is any `async (site, ctx) -> str | None`. Three sources, chained in the configured
order (the first non-empty hint wins): the environment's own `task.hint` (it knows the task,
e.g. the right call for this question), templates per error kind (always answer), and an LLM
behind any OpenAI-compatible server (cached; it may be down, so it fails soft to None).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Literal, Protocol

import httpx
from pydantic import Field, model_validator

from composer_prime.config.base import Strict
from composer_prime.env_runtime.error_sites import ErrorSite, tool_names

log = logging.getLogger(__name__)


@dataclass
class HintContext:
    messages: list[dict]  # the chat history the error turn saw
    turn_text: str  # what the model wrote in the error turn
    tools: list[dict]  # OpenAI function schemas
    task: Any = None  # the environment's task (may define `hint(site, ctx)`)


class Hinter(Protocol):
    def __call__(self, site: ErrorSite, ctx: HintContext) -> Awaitable[str | None]: ...


# --- templates --------------------------------------------------------------------------------

TEMPLATES = {
    "parse": "Your tool call could not be read: {detail}. Write it as {example}.",
    "unknown_tool": "The tool is called {tools}, not `{name}`. Call it as {example}.",
    "bad_arguments": "The arguments of `{name}` are wrong: {detail}. Call it as {example}.",
    "tool_error": "The tool answered with an error: {detail}. Fix the call and try again.",
    "format": "Your reply does not have the required format: {detail}.",
}
GENERIC = "This turn went wrong: {detail}. Fix it and try again."
FIELDS = ("detail", "name", "tools", "example")


def check_template(kind: str, template: str) -> None:
    """Raise at configuration time what `str.format` would raise mid-rollout."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ValueError(f"hint template for {kind!r} is malformed: {e}") from None
    for f in fields:
        if f not in FIELDS:
            raise ValueError(f"hint template for {kind!r} has unknown field {{{f}}}; fields: {', '.join(FIELDS)}")


class HintConfig(Strict):
    """`orchestrator.distill.hints`: where hints come from, tried in order until one answers."""

    sources: list[Literal["env", "template", "llm", "oracle"]] = Field(
        default_factory=lambda: ["env", "template"], min_length=1,
        description='hint sources, tried in this order ("oracle": the task\'s correct turn, a control arm: hint_arms.py)')
    placebo: Literal["off", "shuffle", "other_kind", "words_only", "blank"] = Field(
        "off", description="a control arm: the hint's words shuffled, another error kind's hint, the hint without the "
                           "tool calls it quotes, or a sentence saying nothing about the turn (hint_arms.py)")
    templates: dict[str, str] = Field(default_factory=dict, description="per error kind, overriding the built-in "
                                                                        "templates")
    llm_url: str | None = Field(None, description="any OpenAI-compatible server (our own inference server too)")
    llm_model: str | None = Field(None, description="the model name the llm source asks for")
    llm_timeout_s: float = Field(10.0, gt=0, description="seconds before an llm hint request is given up")
    cache_path: Path | None = Field(None, description="JSONL cache of LLM hints, kept across runs")
    role: str = Field("user", description="the chat role of the inserted hint message")

    @model_validator(mode="after")
    def _check(self) -> "HintConfig":
        for kind, template in self.templates.items():
            check_template(kind, template)
        if "llm" in self.sources and not (self.llm_url and self.llm_model):
            raise ValueError("the llm hint source needs llm_url and llm_model")
        return self


def example_call(tools: list[dict], name: str | None = None) -> str:
    """A one-line call of tool `name` (else the first tool), its required strings as "..."."""
    if not tools:
        return '<tool_call>{"name": "...", "arguments": {...}}</tool_call>'
    fn = next((t["function"] for t in tools if t["function"]["name"] == name), tools[0]["function"])
    params = fn.get("parameters") or {}
    props = params.get("properties", {})
    args = {p: "..." for p in params.get("required", []) if props.get(p, {}).get("type") == "string"}
    return f"<tool_call>{json.dumps({'name': fn['name'], 'arguments': args})}</tool_call>"


class TemplateHinter:
    def __init__(self, templates: dict[str, str] | None = None) -> None:
        self.templates = {**TEMPLATES, **(templates or {})}
        for kind, template in self.templates.items():
            check_template(kind, template)

    async def __call__(self, site: ErrorSite, ctx: HintContext) -> str | None:
        return self.templates.get(site.kind, GENERIC).format(
            detail=site.detail, name=site.name or "", tools=", ".join(f"`{n}`" for n in tool_names(ctx.tools)),
            example=example_call(ctx.tools, site.name))


# --- the environment's own hint -----------------------------------------------------------------

async def task_hook(name: str, site: ErrorSite, ctx: HintContext) -> str | None:
    """The task's own `name(site, ctx)` (sync or async); None where the task has none."""
    hook = getattr(ctx.task, name, None)
    if hook is None:
        return None
    out = hook(site, ctx)
    return await out if inspect.isawaitable(out) else out


class EnvHinter:
    async def __call__(self, site: ErrorSite, ctx: HintContext) -> str | None:
        return await task_hook("hint", site, ctx)


# --- the oracle: the correct turn (a control arm, with the placebo of hint_arms.py) ------------------

ORACLE_CALL = "Use the tool as shown: {turn}"  # the wording of tool-calc's hinted demonstrations (tool_calc.demos)
ORACLE_REPLY = "Reply with exactly: {turn}"


class OracleHinter:
    """The task's correct turn, from its `oracle(site, ctx)`, as the hint (None where it has none):
    a teacher that knows the answer must win clearly, or the channel's plumbing is broken."""

    async def __call__(self, site: ErrorSite, ctx: HintContext) -> str | None:
        turn = await task_hook("oracle", site, ctx)
        if not turn:
            return None
        return (ORACLE_CALL if turn.lstrip().startswith("<tool_call>") else ORACLE_REPLY).format(turn=turn)


# --- an LLM's hint --------------------------------------------------------------------------------

SYSTEM = ("A model learning to use tools made a mistake in one turn. Write a hint of one or two sentences "
          "that helps it fix that turn: what went wrong and what a correct call or reply looks like. "
          "Do not give the final answer to the task. Reply with the hint only.")


def load_cache(path: Path) -> dict[str, str]:
    cache = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line from an interrupted run
        if isinstance(row, dict) and isinstance(row.get("key"), str) and isinstance(row.get("hint"), str):
            cache[row["key"]] = row["hint"]
    return cache


class LLMHinter:
    """Counters: `calls` requests sent, `hits` answered from the cache, `failures` requests that
    timed out or got an unusable reply (the rollout then goes on without this hint)."""

    def __init__(self, url: str, model: str, timeout_s: float = 10.0, cache_path: Path | None = None,
                 max_tokens: int = 64) -> None:
        self.url, self.model, self.timeout_s, self.max_tokens = url.rstrip("/"), model, timeout_s, max_tokens
        self.cache_path = cache_path
        self.cache: dict[str, str] = {}
        self.calls = self.hits = self.failures = 0
        self.client = httpx.AsyncClient(timeout=timeout_s)
        if cache_path is not None and cache_path.exists():
            self.cache = load_cache(cache_path)

    def key(self, site: ErrorSite, ctx: HintContext) -> str:
        fields = [self.model, site.kind, site.detail, ctx.turn_text, tool_names(ctx.tools)]
        return hashlib.sha256(json.dumps(fields).encode()).hexdigest()

    async def __call__(self, site: ErrorSite, ctx: HintContext) -> str | None:
        key = self.key(site, ctx)
        if key in self.cache:
            self.hits += 1
            return self.cache[key]
        hint = await self.ask(site, ctx)
        if hint:
            self.cache[key] = hint
            if self.cache_path is not None:
                self.cache_path.parent.mkdir(parents=True, exist_ok=True)
                with self.cache_path.open("a") as f:
                    f.write(json.dumps({"key": key, "hint": hint}) + "\n")
        return hint

    async def ask(self, site: ErrorSite, ctx: HintContext) -> str | None:
        user = (f"Tools:\n{json.dumps(ctx.tools)}\n\nError ({site.kind}): {site.detail}\n\n"
                f"The turn the model wrote:\n{ctx.turn_text}")
        body = {"model": self.model, "max_tokens": self.max_tokens, "temperature": 0.0,
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]}
        self.calls += 1
        try:
            async with asyncio.timeout(self.timeout_s):  # a total deadline: httpx's is per read
                r = await self.client.post(f"{self.url}/v1/chat/completions", json=body)
            r.raise_for_status()
            return r.json()["choices"][0]["message"]["content"].strip() or None
        except (TimeoutError, httpx.HTTPError, ValueError, LookupError, TypeError, AttributeError) as e:
            self.failures += 1
            if self.failures == 1:  # once: a server that is down would otherwise log every error turn
                log.warning("LLM hinter at %s failed (%s: %s); going on without its hints", self.url,
                            type(e).__name__, e)
            return None

    async def close(self) -> None:
        await self.client.aclose()


# --- the chain ----------------------------------------------------------------------------------

class ChainHinter:
    def __init__(self, hinters: list[Hinter]) -> None:
        self.hinters = hinters

    async def __call__(self, site: ErrorSite, ctx: HintContext) -> str | None:
        for hinter in self.hinters:
            hint = await hinter(site, ctx)
            if hint and hint.strip():
                return hint.strip()
        return None

    async def close(self) -> None:
        for hinter in self.hinters:
            if hasattr(hinter, "close"):
                await hinter.close()


def make_hinter(sources: list[str], templates: dict[str, str], llm_url: str | None, llm_model: str | None,
                llm_timeout_s: float, cache_path: Path | None) -> ChainHinter:
    """The chain of `sources` ("env", "template", "llm", "oracle") in the configured order (the
    placebo wraps a chain: hint_arms.py)."""
    hinters: list[Hinter] = []
    for source in sources:
        if source == "env":
            hinters.append(EnvHinter())
        elif source == "template":
            hinters.append(TemplateHinter(templates))
        elif source == "llm":
            if not llm_url or not llm_model:
                raise ValueError("hint source 'llm' needs both llm_url and llm_model")
            hinters.append(LLMHinter(llm_url, llm_model, llm_timeout_s, cache_path))
        elif source == "oracle":
            hinters.append(OracleHinter())
        else:
            raise ValueError(f"unknown hint source {source!r}; sources: env, template, llm, oracle")
    return ChainHinter(hinters)

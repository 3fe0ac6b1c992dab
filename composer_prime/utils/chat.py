"""Chat rendering with the model's own template, as token ids (never re-tokenised later)."""

from __future__ import annotations

import json
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: a config check imports this (through the distill step) without transformers
    from transformers import PreTrainedTokenizerBase


def encode_chat(tok: PreTrainedTokenizerBase, messages: list[dict], add_generation_prompt: bool = True,
                tools: list[dict] | None = None) -> list[int]:
    """`messages` rendered by the model's template; `tools` (OpenAI function schemas) go to the
    template, which renders them where the model expects its tools (a template may ignore them)."""
    text = tok.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tok.encode(text, add_special_tokens=False)


PROMPTS_KEPT = 8192  # rendered prompts remembered per tokenizer (a few MB at most)
_prompts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {(messages and tools as JSON, template): ids}


def prompt_ids(tok: PreTrainedTokenizerBase, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """`encode_chat(tok, messages, tools=tools)`, remembered: a rollout's prompt is rendered by the
    template once per task, not once per rollout (a group's G rollouts share it, and a task comes
    back in later steps). Jinja rendering was the orchestrator's largest cost per rollout after
    scoring (50 to 230 us, 2-core CPU). A template that reads the clock (`strftime_now`) is
    rendered every time, as are messages that are not JSON."""
    if "strftime_now" in (tok.chat_template or ""):
        return encode_chat(tok, messages, tools=tools)
    try:
        key = (json.dumps([messages, tools or None]), tok.chat_template)  # the template: a caller may swap it
    except (TypeError, ValueError):
        return encode_chat(tok, messages, tools=tools)
    cache = _prompts.setdefault(tok, {})
    if (ids := cache.get(key)) is None:
        if len(cache) >= PROMPTS_KEPT:
            cache.pop(next(iter(cache)))  # the oldest first
        ids = cache[key] = encode_chat(tok, messages, tools=tools)
    return list(ids)  # the caller's own copy: the cached one is never changed


class TemplateError(ValueError):
    """The chat template cannot be continued by appending tokens (it rewrites earlier turns)."""


def suffix_ids(tok: PreTrainedTokenizerBase, before: str, after: str, why: str) -> list[int]:
    """The token ids of what `after` adds to `before`, two renderings of one conversation; `after`
    must start with `before` (an append-only template), else TemplateError saying `why`."""
    if not after.startswith(before):
        raise TemplateError(f"the chat template re-renders earlier turns; {why} needs an append-only template")
    return tok.encode(after[len(before):], add_special_tokens=False)


def continuation_ids(tok: PreTrainedTokenizerBase, history: list[dict], reply: str, new: list[dict]) -> list[int]:
    """Token ids that follow a sampled reply (which ended with the EOS token) when `new`
    messages are appended and the next assistant turn opens.

    Rendered as text difference: template(history + reply + new, generation prompt) must start
    with template(history + reply); what follows the reply's end-of-turn token is tokenised on
    its own. Earlier tokens are never re-tokenised, so they stay the ones that were sampled.
    """
    said = history + [{"role": "assistant", "content": reply}]
    before = tok.apply_chat_template(said, tokenize=False)
    after = tok.apply_chat_template(said + new, tokenize=False, add_generation_prompt=True)
    end = before.rfind(tok.eos_token)
    if end < 0:
        raise TemplateError("the chat template does not end the reply with the EOS token; multi-turn token "
                            "bookkeeping needs it")
    return suffix_ids(tok, before[: end + len(tok.eos_token)], after, "multi-turn token bookkeeping")

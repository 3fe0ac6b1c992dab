"""Chat rendering with the model's own template, as token ids (never re-tokenised later)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def encode_chat(tok: PreTrainedTokenizerBase, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tok.encode(text, add_special_tokens=False)


class TemplateError(ValueError):
    """The chat template cannot be continued by appending tokens (it rewrites earlier turns)."""


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
    if end < 0 or not after.startswith(before[: end + len(tok.eos_token)]):
        raise TemplateError("the chat template re-renders earlier turns; multi-turn token bookkeeping needs an append-only template")
    return tok.encode(after[end + len(tok.eos_token):], add_special_tokens=False)

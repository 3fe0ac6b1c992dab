"""Chat rendering with the model's own template, as token ids (never re-tokenised later)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def encode_chat(tok: PreTrainedTokenizerBase, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tok.encode(text, add_special_tokens=False)

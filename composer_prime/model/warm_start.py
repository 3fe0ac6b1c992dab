"""Answer-only cross-entropy on chat examples: how a small model is warm-started.

`encode_example` turns a chat example into token ids and the answer's mask, for `uv run sft`
(trainer/sft.py: the trainer's own step, the `ce` channel) and the tiny default model's build
(model/tiny.py). That build trains with `sft_step`, the `ce` channel's plain likelihood
normalised by the answer tokens, at the model level: a model's build never imports the trainer
and runs in processes that may already be in a process group (the trainer's rank 0 resolves
the model), so it runs without one, unsharded, on the CPU.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from composer_prime.model.logprobs import token_logprobs
from composer_prime.utils.chat import encode_chat


def encode_example(tok: PreTrainedTokenizerBase, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(token ids, answer mask): the last message must be the assistant's."""
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("the last message must be the assistant's answer")
    prompt = encode_chat(tok, messages[:-1])
    answer = tok.encode(messages[-1]["content"], add_special_tokens=False) + [tok.eos_token_id]
    return prompt + answer, [0] * len(prompt) + [1] * len(answer)


def pad_batch(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), width), pad_id)
    mask = torch.zeros((len(rows), width))
    for i, (r, m) in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float)
    return ids, mask


def sft_step(model, optim, ids: torch.Tensor, answer_mask: torch.Tensor) -> float:
    """One optimizer step of answer-only cross-entropy, mean over answer tokens; returns the loss."""
    lp = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:])
    w = answer_mask[:, 1:]
    loss = -(lp * w).sum() / int(w.sum())
    optim.zero_grad()
    loss.backward()
    optim.step()
    return loss.item()

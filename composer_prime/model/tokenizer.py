"""An offline byte-level BPE tokenizer with a ChatML chat template.

No hub is reachable here, so the tiny default model trains its own tokenizer with the
`tokenizers` library on a fixed built-in corpus. Same corpus, same merges: the result is
deterministic and is part of the tiny model's content hash.
"""

from __future__ import annotations

import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_PROSE = (
    "You are a helpful assistant. Reverse the letters. Use the tools to answer. "
    "The quick brown fox jumps over the lazy dog. Call the tool with its exact name and "
    "arguments, then read the result and reply with the answer only. "
    "system user assistant tool error result value calc add sub mul def return import "
)


# Tool calls in the format the orchestrator parses, so that the tiny model spends a few tokens on
# the call's syntax instead of dozens (tool environments: tool-calc, feature-deletion).
_TOOLS = {"calc": "expr", "read_file": "path", "list_dir": "path", "grep": "pattern", "run_tests": "tests",
          "write_file": "path", "edit": "path", "submit": None}


def _tool_call(rng: random.Random) -> str:
    name = rng.choice(sorted(_TOOLS))
    key = _TOOLS[name]
    value = f"{rng.randint(10, 999)} {rng.choice('+-*')} {rng.randint(10, 999)}" if name == "calc" else "pkg/mod.py"
    args = "{}" if key is None else f'{{"{key}": "{value}"}}'
    return f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'


def _corpus() -> list[str]:
    rng = random.Random(0)
    lines = [_PROSE] * 20
    for _ in range(2000):
        letters = " ".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8)))
        digits = " ".join(str(rng.randint(0, 99)) for _ in range(rng.randint(1, 3)))
        lines.append(f"{letters}\n{digits}")
    lines += [_tool_call(rng) for _ in range(400)]
    return lines


def build_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf

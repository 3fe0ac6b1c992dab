"""The task: questions per split and seed, the calc tool's replies, the reward. Pure Python.

The system prompt and the question format are tool-calc's, so tool-calc's demonstrations
(tool_calc.demos) warm-start a model for this environment too.
"""

from __future__ import annotations

import random
import re

SYSTEM_PROMPT = 'Use calc: <tool_call>{"name": "calc", "arguments": {"expr": "12 * 34"}}</tool_call> then reply with the result.'
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
SPLITS = ("train", "eval")
_EXPR = re.compile(r"^\s*(-?\d+)\s*([+\-*])\s*(-?\d+)\s*$")


def split_of(a: int, b: int) -> str:
    """Held-out questions are those with a + b divisible by 4: the splits never share a question."""
    return "eval" if (a + b) % 4 == 0 else "train"


def question(split: str, seed: int, max_operand: int = 99) -> tuple[int, str, int]:
    """The question of (split, seed): deterministic, and always of that split."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    if max_operand < 10:
        raise ValueError(f"max_operand must be at least 10, not {max_operand}")
    rng = random.Random(f"{split}-{seed}")
    while True:
        a, op, b = rng.randint(10, max_operand), rng.choice(sorted(OPS)), rng.randint(10, max_operand)
        if split_of(a, b) == split:
            return a, op, b


def evaluate(expr: str) -> int:
    """The value of 'integer operator integer'; ValueError naming the expected form otherwise."""
    m = _EXPR.match(expr)
    if m is None:
        raise ValueError(f"cannot evaluate '{expr}': write integer, operator (+ - *), integer, e.g. '12 * 34'")
    return OPS[m.group(2)](int(m.group(1)), int(m.group(3)))


def reward(first_call_ok: bool, answer: str, value: int) -> float:
    """0.5 when the episode's first tool call worked (calc, with its argument as its schema says,
    an expression it can read), plus 0.5 for the right answer. The first half is what a small
    model learns first, and learns from the first turn alone: the tool's name and argument, which
    tool-calc's demonstrations get wrong on purpose."""
    return 0.5 * first_call_ok + 0.5 * (answer.strip() == str(value))

"""small-sums: "What is 3 + 4? Reply with the number only." for a small real model (SmolLM2-135M).

A task a 135M instruct model answers sometimes, not never and not always, so that GRPO has
signal from step 0: sampled at temperature 0.7, SmolLM2-135M-Instruct gets about 0.4 of these
right, against about 0.02 on reverse-text and none of two-digit additions (configs/smollm2-135m.toml
records the measurements). The reward reads the reply's last integer, so "3 + 4 = 7" counts: a
reply cut at `max_tokens` before its answer does not, which is what teaches it to be brief.
Held-out questions are a fixed set of operand pairs that never appear in training.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf
from pydantic import model_validator

PROMPT = "What is {a} + {b}? Reply with the number only."
_INTEGER = re.compile(r"-?\d+")


def last_integer(text: str) -> int | None:
    """The last integer written in `text` (None if there is none)."""
    found = _INTEGER.findall(text)
    return int(found[-1]) if found else None


class SmallSumsData(vf.TaskData):
    answer: str


class SmallSumsTask(vf.Task[SmallSumsData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(last_integer(trace.last_reply) == int(self.data.answer))

    @vf.metric
    async def number_only(self, trace: vf.Trace) -> float:
        """1 when the reply is the number and nothing else (what the prompt asks for)."""
        return float(trace.last_reply.strip() == self.data.answer)


class SmallSumsConfig(vf.TasksetConfig):
    num_tasks: int = 2000
    split: str = "train"  # "train" | "eval": disjoint operand pairs
    max_operand: int = 9  # operands 1..max_operand
    held_out: int = 24  # operand pairs kept for "eval"
    seed: int = 0

    @model_validator(mode="after")
    def _held_out_fits(self) -> SmallSumsConfig:
        pairs = self.max_operand ** 2
        if self.max_operand < 1 or not 0 < self.held_out < pairs:
            raise ValueError(f"held_out must be between 1 and {pairs - 1} (max_operand {self.max_operand} gives {pairs} "
                             "operand pairs)")
        return self


def split_pairs(config: SmallSumsConfig) -> list[tuple[int, int]]:
    """The operand pairs of one split: "eval" a fixed shuffled subset, "train" `num_tasks` draws
    from the rest (pairs repeat: there are only max_operand² of them)."""
    pairs = [(a, b) for a in range(1, config.max_operand + 1) for b in range(1, config.max_operand + 1)]
    random.Random(10_000 + config.seed).shuffle(pairs)
    held_out, train = pairs[: config.held_out], pairs[config.held_out:]
    if config.split == "eval":
        return held_out[: config.num_tasks]
    rng = random.Random(config.seed)
    return [rng.choice(train) for _ in range(config.num_tasks)]


class SmallSumsTaskset(vf.Taskset[SmallSumsTask, SmallSumsConfig]):
    def load(self) -> list[SmallSumsTask]:
        return [
            SmallSumsTask(SmallSumsData(id=f"{self.config.split}-{i}", prompt=PROMPT.format(a=a, b=b), answer=str(a + b)),
                          self.config.task)
            for i, (a, b) in enumerate(split_pairs(self.config))
        ]

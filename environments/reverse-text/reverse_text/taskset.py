"""reverse-text: reverse a short sequence of space-separated letters.

Small enough for a 1M-parameter model to learn in CPU minutes, with partial credit so that
a group of rollouts has reward spread: reward = LCS(reply, answer) / max(len) over letters.
Training and held-out splits are disjoint by construction (different seeds, de-duplicated).
"""

from __future__ import annotations

import random

import verifiers.v1 as vf

SYSTEM_PROMPT = "Reverse the letters."
ALPHABET = "abcdefgh"


def make_sequence(rng: random.Random, min_len: int, max_len: int) -> list[str]:
    return [rng.choice(ALPHABET) for _ in range(rng.randint(min_len, max_len))]


def lcs_len(a: list[str], b: list[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def similarity(reply: str, answer: str) -> float:
    got, want = reply.split(), answer.split()
    if not got or not want:
        return 0.0
    return lcs_len(got, want) / max(len(got), len(want))


class ReverseTextData(vf.TaskData):
    answer: str


class ReverseTextTask(vf.Task[ReverseTextData]):
    @vf.reward(weight=1.0)
    async def lcs_similarity(self, trace: vf.Trace) -> float:
        return similarity(trace.last_reply, self.data.answer)

    @vf.metric
    async def exact_match(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.split() == self.data.answer.split())


class ReverseTextConfig(vf.TasksetConfig):
    num_tasks: int = 2000
    split: str = "train"  # "train" | "eval": disjoint sequence sets
    min_len: int = 3
    max_len: int = 6
    seed: int = 0


def split_sequences(config: ReverseTextConfig) -> list[list[str]]:
    """Deterministic sequences of one split; eval sequences never appear in train."""
    eval_rng = random.Random(10_000 + config.seed)
    eval_seqs: list[list[str]] = []
    seen: set[str] = set()
    while len(eval_seqs) < 200:
        s = make_sequence(eval_rng, config.min_len, config.max_len)
        if " ".join(s) not in seen:
            seen.add(" ".join(s))
            eval_seqs.append(s)
    if config.split == "eval":
        return eval_seqs[: config.num_tasks]
    rng = random.Random(config.seed)
    train: list[list[str]] = []
    while len(train) < config.num_tasks:
        s = make_sequence(rng, config.min_len, config.max_len)
        if " ".join(s) not in seen:
            train.append(s)
    return train


class ReverseTextTaskset(vf.Taskset[ReverseTextTask, ReverseTextConfig]):
    def load(self) -> list[ReverseTextTask]:
        return [
            ReverseTextTask(
                ReverseTextData(
                    id=f"{self.config.split}-{i}",
                    prompt=" ".join(seq),
                    system_prompt=SYSTEM_PROMPT,
                    answer=" ".join(reversed(seq)),
                ),
                self.config.task,
            )
            for i, seq in enumerate(split_sequences(self.config))
        ]

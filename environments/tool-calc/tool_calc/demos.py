"""Demonstrations for warm-starting a small model on tool-calc, wrong calls included.

A tiny model knows nothing of tools; these chat examples (the last assistant message is the
target) teach it the episode's shape: call `calc`, then reply with the result. A share of the
first calls are deliberately wrong (a misnamed tool, a misspelt argument, a number instead of a
string, an unclosed tag), so the warm-started policy makes the errors the hint-distillation
channel trains on. Some examples put a hint message before the turn and answer with the hinted
call: the instruction following a real LLM brings, which a hinted teacher relies on.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from .taskset import OPS, SYSTEM_PROMPT, ToolCalcConfig, answer, questions

WRONG_CALLS = (
    lambda e: {"name": "calculator", "arguments": {"expr": e}},
    lambda e: {"name": "calculate", "arguments": {"expr": e}},
    lambda e: {"name": "calc", "arguments": {"expression": e}},
    lambda e: {"name": "calc", "arguments": {"input": e}},
)


def call_text(call: dict) -> str:
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def demonstrations(n: int, error_rate: float = 0.5, hint_rate: float = 0.2, seed: int = 0,
                   max_operand: int = 999) -> list[dict]:
    """`n` examples over training questions (never the held-out ones)."""
    rng = random.Random(seed)
    qs = questions(ToolCalcConfig(num_tasks=max(n, 1), seed=seed, max_operand=max_operand))
    out = []
    for a, op, b in qs[:n]:
        expr, value = f"{a} {op} {b}", str(OPS[op](a, b))
        opening = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": expr}]
        right = call_text({"name": "calc", "arguments": {"expr": expr}})
        wrong_call = rng.choice(WRONG_CALLS)(expr)
        wrong = call_text(wrong_call)
        error = answer(wrong_call["name"], wrong_call["arguments"])["content"]
        failed = opening + [{"role": "assistant", "content": wrong}, {"role": "tool", "content": f"error: {error}"}]
        rest = 1 - hint_rate
        shape = rng.choices(["hint", "wrong", "right", "recover", "answer"],
                            [hint_rate, rest * error_rate, rest * (1 - error_rate) * 0.4, rest * 0.2, rest * 0.4])[0]
        if shape == "hint":  # a hinted turn: follow the hint
            hint = f"Use the tool as shown: {right}"
            out.append(opening + [{"role": "user", "content": hint}, {"role": "assistant", "content": right}])
        elif shape == "wrong":  # the first call goes wrong
            out.append(opening + [{"role": "assistant", "content": wrong}])
        elif shape == "right":
            out.append(opening + [{"role": "assistant", "content": right}])
        elif shape == "recover":  # after an error, the right call
            out.append(failed + [{"role": "assistant", "content": right}])
        else:  # after the tool's answer, the answer
            out.append(opening + [{"role": "assistant", "content": right}, {"role": "tool", "content": value},
                                  {"role": "assistant", "content": value}])
    return [{"messages": m} for m in out]


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description="write tool-calc warm-start demonstrations as JSONL (for `uv run sft`)")
    p.add_argument("--out", required=True)
    p.add_argument("-n", type=int, default=2000)
    p.add_argument("--error-rate", type=float, default=0.5)
    p.add_argument("--hint-rate", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-operand", type=int, default=999)
    a = p.parse_args()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)  # a fresh clone has no outputs/ yet
    with open(a.out, "w") as f:
        for d in demonstrations(a.n, a.error_rate, a.hint_rate, a.seed, a.max_operand):
            f.write(json.dumps(d) + "\n")
    print(f"wrote {a.n} demonstrations to {a.out}")  # the result, for a newcomer and a script alike


if __name__ == "__main__":
    main()

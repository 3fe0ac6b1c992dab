"""tool-calc: answer an arithmetic question by calling the `calc` tool, then replying with its result.

The numbers are too large for a tiny model to compute, so reward comes only through the tool.
Every way to get the call wrong (a wrong tool name, a missing or misspelt argument, an
expression the tool cannot read) comes back as a tool error with a specific message: these
error turns are what the hint-distillation channel trains on.
"""

from __future__ import annotations

import json
import random
import re

import verifiers.v1 as vf

SYSTEM_PROMPT = 'Use calc: <tool_call>{"name": "calc", "arguments": {"expr": "12 * 34"}}</tool_call> then reply with the result.'
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_EXPR = re.compile(r"^\s*(-?\d+)\s*([+\-*])\s*(-?\d+)\s*$")
_INTEGER = re.compile(r"-?[0-9]+")
CALC_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate one integer expression: integer, operator (+ - *), integer.",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"],
                       "additionalProperties": False},
    },
}


def evaluate(expr: str) -> int:
    m = _EXPR.match(expr)
    if m is None:
        raise ValueError(f"cannot evaluate '{expr}': write integer, operator (+ - *), integer, e.g. '12 * 34'")
    return OPS[m.group(2)](int(m.group(1)), int(m.group(3)))


def answer(name: str, arguments: dict) -> dict:
    """What the tool replies to one call: the value, or the specific error for this way of getting it wrong."""
    def error(msg: str) -> dict:
        return {"content": msg, "is_error": True, "done": False}

    if name != "calc":
        return error(f"unknown tool '{name}': the only tool is 'calc'")
    if set(arguments) != {"expr"}:
        extra = sorted(set(arguments) - {"expr"})
        return error("calc takes one argument, 'expr'" + (f"; got {extra}" if extra else ""))
    if not isinstance(arguments["expr"], str):
        return error("'expr' must be a string, e.g. \"12 * 34\"")
    try:
        return {"content": str(evaluate(arguments["expr"])), "is_error": False, "done": False}
    except ValueError as e:
        return error(str(e))


class CalcSession:
    """One rollout's tool: stateless arithmetic, plus the record of calls the rewards read."""

    tools = [CALC_SCHEMA]

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict, dict]] = []

    async def call(self, name: str, arguments: dict) -> dict:
        result = answer(name, arguments)
        self.calls.append((name, arguments, result))
        return result

    async def close(self) -> None:
        pass


def final_reply_is_a_number(k: int, turn, tools: list[dict]):
    """The format rule for the orchestrator's error-site detection: a finished reply without a
    call is the answer, and `correct` compares it as a bare integer."""
    if turn.call is not None or turn.finish_reason != "stop" or _INTEGER.fullmatch(turn.text.strip()):
        return None
    from composer_prime.env_runtime.error_sites import ErrorSite  # lazy: this package installs on its own

    return ErrorSite(k, "format", "the final reply must be the number only")


class ToolCalcData(vf.TaskData):
    answer: str


class ToolCalcTask(vf.Task[ToolCalcData]):
    error_rules = [final_reply_is_a_number]  # extra rules for the orchestrator's error-site detection

    async def open_session(self) -> CalcSession:
        return CalcSession()

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.metric
    async def calc_ok(self, trace: vf.Trace, runtime: CalcSession) -> float:
        """1 when a call returned the right value (the episode used the tool as intended)."""
        return float(any(not r["is_error"] and r["content"] == self.data.answer for _, _, r in runtime.calls))

    def hint(self, site, ctx) -> str | None:
        """The hint for an error turn of this question: the exact call it needs. The answer itself
        only once the tool has returned it, so the hint never does the tool's work."""
        call = f'<tool_call>{json.dumps({"name": "calc", "arguments": {"expr": self.data.prompt}})}</tool_call>'
        if site.kind == "unknown_tool":
            return f"The only tool is `calc`, not `{site.name}`: {call}"
        if site.kind == "parse":
            return f"Write the call as valid JSON inside the tags: {call}"
        if site.kind in ("bad_arguments", "tool_error"):
            return f"`calc` takes one argument, `expr`, the expression as a string: {call}"
        if site.kind == "format":
            if any(m.get("role") == "tool" and m.get("content") == self.data.answer for m in ctx.messages):
                return f"Reply with the number only: {self.data.answer}"
            return f"First call the tool, {call}, then reply with its result only."
        return None

    def oracle(self, site, ctx) -> str:
        """The correct turn itself (the distill channel's oracle arm): the answer once the tool has
        returned it, else the exact call."""
        if any(m.get("role") == "tool" and m.get("content") == self.data.answer for m in ctx.messages):
            return self.data.answer
        return f'<tool_call>{json.dumps({"name": "calc", "arguments": {"expr": self.data.prompt}})}</tool_call>'


class ToolCalcConfig(vf.TasksetConfig):
    num_tasks: int = 2000
    split: str = "train"  # "train" | "eval": disjoint questions
    max_operand: int = 999
    seed: int = 0


def questions(config: ToolCalcConfig) -> list[tuple[int, str, int]]:
    """Deterministic (a, op, b) of one split; held-out questions never appear in train."""
    def draw(rng: random.Random) -> tuple[int, str, int]:
        return rng.randint(10, config.max_operand), rng.choice(sorted(OPS)), rng.randint(10, config.max_operand)

    eval_rng, held_out = random.Random(10_000 + config.seed), []
    while len(held_out) < 200:
        if (q := draw(eval_rng)) not in held_out:
            held_out.append(q)
    if config.split == "eval":
        return held_out[: config.num_tasks]
    rng, seen, train = random.Random(config.seed), set(held_out), []
    while len(train) < config.num_tasks:
        if (q := draw(rng)) not in seen:
            train.append(q)
    return train


class ToolCalcTaskset(vf.Taskset[ToolCalcTask, ToolCalcConfig]):
    def load(self) -> list[ToolCalcTask]:
        return [
            ToolCalcTask(ToolCalcData(id=f"{self.config.split}-{i}", prompt=f"{a} {op} {b}", system_prompt=SYSTEM_PROMPT,
                                      answer=str(OPS[op](a, b))), self.config.task)
            for i, (a, op, b) in enumerate(questions(self.config))
        ]

"""Inference server -> orchestrator: what the token route and the score route answer.

The token route (/inference/v1/generate) answers n generations of one prompt as JSON
(`generate_answer`, read back by `completions`); the score route (/inference/v1/score) answers
`Scores` as its fields. Log-probs follow one convention everywhere in composer-prime: they are
log-probs of the distribution actually sampled from (logits divided by the temperature), so the
trainer can recompute them exactly.

A completion ends at its first stop token (kept) or at its token budget: `completion_end` says where,
and nothing after it is ever part of a rollout (orchestrator/rollouts.py) nor accepted from a
volunteer (volunteer/validator.py: a completion cut short or run past a stop token is rejected).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


def completion_end(token_ids: Sequence[int], stop_token_ids: Iterable[int]) -> int:
    """The length of the completion that counts: up to and including its first stop token, all of it
    without one."""
    stops = set(stop_token_ids)
    return next((i + 1 for i, t in enumerate(token_ids) if t in stops), len(token_ids))


def boundary_valid(token_ids: Sequence[int], stop_token_ids: Iterable[int], max_tokens: int) -> bool:
    """A whole completion: it ends in its first stop token, or has none and fills `max_tokens` (the
    request's budget, which the orchestrator already cut to the sequence's room)."""
    stops = set(stop_token_ids)
    end = completion_end(token_ids, stops)
    return end == len(token_ids) and (bool(token_ids) and token_ids[-1] in stops or len(token_ids) == max_tokens)


@dataclass
class Generation:
    """What an engine generates for one prompt (inference/engines/base.py)."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # one per completion token, under the sampling distribution
    finish_reason: str  # "stop" | "length"
    weight_version: int = 0  # stamped by the server: the version in force when the request came


@dataclass
class Completion:
    """One choice of a token route answer, as the orchestrator reads it."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_version: int
    node: str = ""  # the inference node that answered (its URL), set by the client that asked
    verdict: str = ""  # a volunteer's completion the validator rejected: which check failed


@dataclass
class Scores:
    """The next-token distribution at positions j in [start, len): the one predicting token_ids[j]."""

    token_logprobs: list[float]  # log-prob of the actual token_ids[j]
    top_ids: list[list[int]]  # k per position, by log-prob descending
    top_logprobs: list[list[float]]
    weight_version: int = 0


def generate_answer(prompt_ids: list[int], gens: list[Generation]) -> dict[str, Any]:
    """The token route's body for `gens` (choice i is gens[i]); its `weight_version` is the oldest
    choice's. The log-probs are in OpenAI's shape, which verifiers' training client reads."""
    return {
        "prompt_token_ids": prompt_ids,
        "weight_version": min(g.weight_version for g in gens),
        "choices": [{
            "index": i,
            "token_ids": g.token_ids,
            "logprobs": {"content": [{"token_id": t, "logprob": lp} for t, lp in zip(g.token_ids, g.logprobs)]},
            "finish_reason": g.finish_reason,
            "weight_version": g.weight_version,
        } for i, g in enumerate(gens)],
    }


def completions(answer: dict[str, Any]) -> list[Completion]:
    """The choices of a token route answer, in order (a choice without its own version has the answer's)."""
    return [Completion(c["token_ids"], [x["logprob"] for x in c["logprobs"]["content"]], c["finish_reason"],
                       int(c.get("weight_version", answer["weight_version"]))) for c in answer["choices"]]

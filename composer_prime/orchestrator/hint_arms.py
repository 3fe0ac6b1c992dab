"""The control arms of hint self-distillation: a placebo hint and an oracle hint.

- **placebo**: the same channel with a hint that carries no information about the turn: the real
  hint's words shuffled (`shuffle`, a fixed permutation per hint text), or the hint the chain gives
  for another error kind at the same turn (`other_kind`, kinds taken in turn). If the placebo arm
  gains as much as the real one, the gain came from having a hint at all, not from what it says
  (a retry study saw gibberish hints gain +10.8 points against +12.0 for gold ones).
- **oracle**: the teacher sees the correct turn itself, from the task's `oracle(site, ctx)` (the
  exact call, or the exact reply once the tool has answered). It checks the plumbing: a teacher
  that knows the answer must win clearly, or the channel is broken.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

from composer_prime.env_runtime.error_sites import KINDS, ErrorSite
from composer_prime.orchestrator.hints import Hinter, HintContext, task_hook

ORACLE_CALL = "Use the tool as shown: {turn}"  # the wording of tool-calc's hinted demonstrations (tool_calc.demos)
ORACLE_REPLY = "Reply with exactly: {turn}"


def shuffled(hint: str) -> str:
    """The hint's words in a fixed pseudo-random order (seeded by the text: reproducible across runs)."""
    words = hint.split()
    random.Random(int(hashlib.sha256(hint.encode()).hexdigest()[:16], 16)).shuffle(words)
    return " ".join(words)


def other_kind(kind: str) -> str:
    """The next known error kind after `kind` (a kind outside KINDS gets the first)."""
    return KINDS[(KINDS.index(kind) + 1) % len(KINDS)] if kind in KINDS else KINDS[0]


class PlaceboHinter:
    """Wraps the real chain: `shuffle` its hint's words, or ask it for `other_kind`'s hint."""

    def __init__(self, inner: Hinter, how: str) -> None:
        if how not in ("shuffle", "other_kind"):
            raise ValueError(f"unknown placebo {how!r}; placebos: shuffle, other_kind")
        self.inner, self.how = inner, how

    async def __call__(self, site: ErrorSite, ctx: HintContext) -> str | None:
        if self.how == "other_kind":
            return await self.inner(replace(site, kind=other_kind(site.kind)), ctx)
        hint = await self.inner(site, ctx)
        return shuffled(hint) if hint else hint

    async def close(self) -> None:
        if hasattr(self.inner, "close"):
            await self.inner.close()


class OracleHinter:
    """The task's correct turn as the hint (None where the task has no `oracle` hook)."""

    async def __call__(self, site: ErrorSite, ctx: HintContext) -> str | None:
        turn = await task_hook("oracle", site, ctx)
        if not turn:
            return None
        return (ORACLE_CALL if turn.lstrip().startswith("<tool_call>") else ORACLE_REPLY).format(turn=turn)

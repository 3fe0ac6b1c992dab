"""The placebo arm of hint self-distillation (the oracle arm's hinter is hints.OracleHinter).

- **placebo**: the same channel with a hint that carries no information about the turn: the real
  hint's words shuffled (`shuffle`, a fixed permutation per hint text), or the hint the chain gives
  for another error kind at the same turn (`other_kind`, kinds taken in turn), or the hint's words
  without the tool calls it quotes (`words_only`: where every hint quotes the correct call, as
  tool-calc's do, the first two keep that call and so are no placebo there), or `blank`: a hint that
  says nothing about the turn (`BLANK`), for the lift of having a hint at all. If the placebo arm
  gains as much as the real one, the gain came from having a hint at all, not from what it says
  (a retry study saw gibberish hints gain +10.8 points against +12.0 for gold ones).
- **oracle** (hints.py, source "oracle"): the teacher sees the correct turn itself, from the task's
  `oracle(site, ctx)`. It checks the plumbing: a teacher that knows the answer must win clearly.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

from composer_prime.env_runtime.error_sites import KINDS, ErrorSite
from composer_prime.env_runtime.tool_calls import without_calls
from composer_prime.orchestrator.hints import Hinter, HintContext


BLANK = "Look at your last message again before you answer."  # the `blank` placebo: no word about the turn


def shuffled(hint: str) -> str:
    """The hint's words in a fixed pseudo-random order (seeded by the text: reproducible across runs)."""
    words = hint.split()
    random.Random(int(hashlib.sha256(hint.encode()).hexdigest()[:16], 16)).shuffle(words)
    return " ".join(words)


def other_kind(kind: str) -> str:
    """The next known error kind after `kind` (a kind outside KINDS gets the first)."""
    return KINDS[(KINDS.index(kind) + 1) % len(KINDS)] if kind in KINDS else KINDS[0]


PLACEBOS = ("shuffle", "other_kind", "words_only", "blank")


class PlaceboHinter:
    """Wraps the real chain: `shuffle` its hint's words, ask it for `other_kind`'s hint, keep its `words_only`, or
    say the `blank` sentence where it has a hint."""

    def __init__(self, inner: Hinter, how: str) -> None:
        if how not in PLACEBOS:
            raise ValueError(f"unknown placebo {how!r}; placebos: {', '.join(PLACEBOS)}")
        self.inner, self.how = inner, how

    async def __call__(self, site: ErrorSite, ctx: HintContext) -> str | None:
        if self.how == "other_kind":
            return await self.inner(replace(site, kind=other_kind(site.kind)), ctx)
        hint = await self.inner(site, ctx)
        if not hint:
            return hint
        if self.how == "blank":  # only where a real hint exists: the same sites as the real arm
            return BLANK
        return shuffled(hint) if self.how == "shuffle" else (without_calls(hint) or None)

    async def close(self) -> None:
        if hasattr(self.inner, "close"):
            await self.inner.close()

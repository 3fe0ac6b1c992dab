"""The placebo arm of hint self-distillation (the oracle arm's hinter is hints.OracleHinter).

- **placebo**: the same channel with a hint that carries no information about the turn: the real
  hint's words shuffled (`shuffle`, a fixed permutation per hint text), or the hint the chain gives
  for another error kind at the same turn (`other_kind`, kinds taken in turn). If the placebo arm
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
from composer_prime.orchestrator.hints import Hinter, HintContext


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

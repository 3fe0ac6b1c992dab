"""The outer-sync hook: what wraps the trainer loop when trainers in several places train one model.

The loop (trainer/train.py) is never edited for it, as torchtitan wraps its loop in semi-sync
training: `run` enters the hook around `fit`, checkpoints the hook's state beside the model and
adds its metrics to each step's line. By default nothing happens (`NoSync`). An implementation is
one module plus a registration: an entry point in the `composer_prime.outer_syncs` group whose
name is a `TrainerConfig` field; the hook runs when that field is set (`[diloco]` runs
trainer/diloco.py's `Island`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from composer_prime.utils import plugins

OUTER_SYNCS = "composer_prime.outer_syncs"  # the entry-point group outer syncs register in


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class OuterSync(contextlib.AbstractContextManager, Protocol):
    """Entered around the loop; its `state` is checkpointed with the model (by label), its
    `metrics` (since the last call) join the step's metrics line."""

    def state(self) -> dict[str, Stateful]: ...
    def metrics(self) -> dict[str, float]: ...


class NoSync(contextlib.nullcontext):
    """One trainer, nothing outside it: the default."""

    def state(self) -> dict[str, Stateful]:
        return {}

    def metrics(self) -> dict[str, float]:
        return {}


def build(cfg: Any, trainer: Any) -> OuterSync:
    """The hook the config asks for: the registered outer sync whose config field is set, else NoSync.
    `trainer` is train.Trainer (model, optimizer, ...), built and not yet resumed."""
    chosen = sorted(n for n in plugins.names(OUTER_SYNCS) if getattr(cfg, n, None) is not None)
    if len(chosen) > 1:
        raise SystemExit(f"trainer: {', '.join(chosen)} are set; one outer sync at a time")
    return plugins.load(OUTER_SYNCS)[chosen[0]](cfg, trainer) if chosen else NoSync()

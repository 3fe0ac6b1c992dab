"""A pair of a DPO dataset (from `composer-prime traces dataset`) as the `dpo` channel's two rows:
what `rl`'s replay step (orchestrator/replay.py) and `sft --objective dpo` (trainer/sft.py) train on.

The token ids are `traces.dataset.render`'s, the function the reference log-probs were computed
with, so a policy equal to the reference gives exactly ln 2; the pair's weight is on the reply's
tokens, and each row carries its `PairRow` (contract/dpo.py).

A replay pair is one assistant turn, chosen against rejected after the same history: the turn
where the two diverge. `divergence_tokens = k > 0` narrows the loss further, to the k tokens from
the first where the two replies' ids differ, on both rows:

    d = min{ i >= reply start : chosen[i] != rejected[i] }   (the reply start if one row is a prefix of the other)
    weighted tokens of each row = [d, min(d + k, len(row)))

The shared prefix before d cancels in DPO's margin anyway; what is dropped is the tail after the
k-th token. The dataset's reference log-prob covers the whole reply, so masked rows need a
reference the trainer computes (`trainer.loss.dpo.reference` "initial" or "recent").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composer_prime.contract.batches import Sample
from composer_prime.contract.dpo import PairRow
from composer_prime.traces.dataset import render

if TYPE_CHECKING:  # the replay step imports this module at every config check: no transformers then
    from transformers import PreTrainedTokenizerBase


def divergence(chosen: list[int], rejected: list[int], start: int) -> int:
    """The first position at or after `start` where the two rows' ids differ; `start` if none does
    (one row a prefix of the other: then neither would keep a weighted token at the shorter's end)."""
    return next((i for i in range(start, min(len(chosen), len(rejected))) if chosen[i] != rejected[i]), start)


def pair_samples(tok: PreTrainedTokenizerBase, row: dict, pair: str, weight: float = 1.0,
                 policy_version: int = 0, divergence_tokens: int = 0) -> list[Sample]:
    """The dataset row as two samples, chosen then rejected; `pair` names the pair within its batch.
    `divergence_tokens` > 0: the weight only on that many tokens from the first that differs.
    TemplateError if the template cannot render it."""
    rendered = {side: render(tok, row["prompt"], row[side][0]) for side in ("chosen", "rejected")}
    (ids_w, start), (ids_l, _) = rendered["chosen"], rendered["rejected"]
    d = divergence(ids_w, ids_l, start) if divergence_tokens else start
    out = []
    for side, (ids, start) in rendered.items():
        n = len(ids)
        end = min(d + divergence_tokens, n) if divergence_tokens else n
        out.append(Sample(ids, [0.0] * n, [0.0] * n, {"dpo": [0.0] * d + [weight] * (end - d) + [0.0] * (n - end)},
                          temperature=1.0, policy_version=policy_version,
                          channel_data={"dpo": PairRow(pair=pair, chosen=side == "chosen",
                                                       ref_logp=float(row[f"ref_{side}_logps"]))}))
    return out

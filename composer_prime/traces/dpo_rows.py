"""A pair of a DPO dataset (from `composer-prime traces dataset`) as the `dpo` channel's two rows:
what `rl`'s replay step (orchestrator/replay.py) and `sft --objective dpo` (trainer/sft.py) train on.

The token ids are `traces.dataset.render`'s, the function the reference log-probs were computed
with, so a policy equal to the reference gives exactly ln 2; the pair's weight is on the reply's
tokens, and each row carries its `PairRow` (contract/dpo.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composer_prime.contract.batches import Sample
from composer_prime.contract.dpo import PairRow
from composer_prime.traces.dataset import render

if TYPE_CHECKING:  # the replay step imports this module at every config check: no transformers then
    from transformers import PreTrainedTokenizerBase


def pair_samples(tok: PreTrainedTokenizerBase, row: dict, pair: str, weight: float = 1.0,
                 policy_version: int = 0) -> list[Sample]:
    """The dataset row as two samples, chosen then rejected; `pair` names the pair within its batch.
    TemplateError if the template cannot render it."""
    out = []
    for side in ("chosen", "rejected"):
        ids, start = render(tok, row["prompt"], row[side][0])
        n = len(ids)
        out.append(Sample(ids, [0.0] * n, [0.0] * n, {"dpo": [0.0] * start + [weight] * (n - start)},
                          temperature=1.0, policy_version=policy_version,
                          channel_data={"dpo": PairRow(pair=pair, chosen=side == "chosen",
                                                       ref_logp=float(row[f"ref_{side}_logps"]))}))
    return out

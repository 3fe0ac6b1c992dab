"""The `dpo` channel: Direct Preference Optimization on (chosen, rejected) pairs (Rafailov et al.).

    L = - log sigma( beta * [ (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l)) ] )

with log pi(y) the sequence log-prob summed over the response tokens (the tokens the channel
weights), beta = 0.1 by default (TRL's), and the reference log-probs shipped with each pair
(`ref_logp`, computed once by the frozen reference when the pairs were made; never dummies).

A pair travels as two samples (rows) of the batch, each with `channel_data["dpo"] =
{"pair": id, "chosen": bool, "ref_logp": float}` and the pair's weight on its response tokens
(the same on both rows; a pair of weight 0 has no dpo tokens and contributes nothing): the
`PairRow` of composer_prime/contract/dpo.py, which checks it on arrival.

The two rows of a pair may land in different micro-batches or ranks, and the loss is not a sum
over them. So `begin` scores every dpo row once with the current policy (no grad), which gives
each pair's margin Delta before any micro-batch runs; each row then carries the pair's loss and
the exact gradient of its own half, dL/dlog pi(y) * log pi(y), through a surrogate:

    row loss = w * L  +  2 * w * g * (S - S.detach())      g = -beta*sigmoid(-Delta) (chosen), +beta*sigmoid(-Delta) (rejected)

Divided by the dpo rows (two per pair: `normaliser = "sequences"`), the loss and its gradient
are the mean over pairs of w * L and of its gradient; nothing else is approximated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from composer_prime.contract.batches import Batch, Sample
from composer_prime.contract.dpo import check_pairs, check_row, pair_weight
from composer_prime.trainer.data import MicroBatch, collate
from composer_prime.trainer.loss import Channel, Context, LossInputs, token_logprobs


class DPOLossConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    beta: float = Field(0.1, gt=0, description="DPO's beta: how far from the reference the margin is measured")
    score_batch: int = Field(16, ge=1, description="rows per no-grad forward when scoring the pairs at the step's start")


def dpo_loss(pi_w: torch.Tensor, pi_l: torch.Tensor, ref_w: torch.Tensor, ref_l: torch.Tensor, beta: float) -> torch.Tensor:
    """Per pair -log sigma(beta * margin), from sequence log-probs (TRL's `sigmoid` loss)."""
    return F.softplus(-beta * ((pi_w - ref_w) - (pi_l - ref_l)))


def sequence_logprobs(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per row, the log-prob of the response: summed over the tokens the channel weights."""
    return (logprobs * (weights != 0)).sum(-1)


class DPOChannel(Channel):
    name = "dpo"
    Config = DPOLossConfig

    def __init__(self, cfg: DPOLossConfig, ctx: Context | None = None) -> None:
        super().__init__(cfg, ctx)
        self.pairs: dict[str, dict] = {}  # this step's pairs: margins, coefficients, losses

    def normaliser(self) -> str:
        return "sequences"

    def check(self, sample: Sample) -> None:
        check_row(sample)

    def check_batch(self, batch: Batch) -> None:
        check_pairs(batch.samples)

    def begin(self, batch: Batch) -> None:
        """Score every weighted dpo row with the current policy; margins, losses and gradient coefficients per pair."""
        rows = [s for s in batch.samples if "dpo" in s.channel_data and pair_weight(s) != 0]
        beta, self.pairs = self.cfg.beta, {}
        policy = self.ctx.policy
        with torch.no_grad():
            for i in range(0, len(rows), self.cfg.score_batch):
                chunk = rows[i:i + self.cfg.score_batch]
                mb = collate(chunk, self.ctx.pad_id, ["dpo"], self.ctx.device, self.ctx.share_cap)
                lp = token_logprobs(mb.logits(policy), mb.input_ids[:, 1:], mb.temperature)
                seqs = sequence_logprobs(lp, mb.channel_weights["dpo"]).tolist()
                for row, d in mb.channel_data["dpo"]:  # the micro-batch's row order (shared rows regroup the chunk)
                    self.pairs.setdefault(d["pair"], {})["w" if d["chosen"] else "l"] = (seqs[row], d["ref_logp"])
        for p in self.pairs.values():
            (pi_w, ref_w), (pi_l, ref_l) = p["w"], p["l"]
            margin = (pi_w - ref_w) - (pi_l - ref_l)
            p["loss"] = float(dpo_loss(*(torch.tensor(v, dtype=torch.float64) for v in (pi_w, pi_l, ref_w, ref_l)), beta))
            p["g"] = beta * torch.sigmoid(torch.tensor(-beta * margin, dtype=torch.float64)).item()  # -dL/dlog pi(y_w)
            p["right"] = float(margin > 0)
        self.tokens_per_pair = batch.channel_token_counts().get("dpo", 0) / max(1, len(self.pairs))

    def prepare(self, mb: MicroBatch, x: LossInputs) -> torch.Tensor:
        """Per row of the micro-batch: (pair loss, gradient coefficient, chosen-preferred); zeros elsewhere."""
        out = torch.zeros((mb.input_ids.shape[0], 3), device=x.logprobs.device)
        for row, d in mb.channel_data.get("dpo", []):
            p = self.pairs.get(d["pair"])
            if p is not None:
                out[row] = torch.tensor([p["loss"], -p["g"] if d["chosen"] else p["g"], p["right"] if d["chosen"] else 0.0])
        return out

    def loss(self, x: LossInputs, w: torch.Tensor, prepared: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        weight = w.abs().amax(-1)  # the pair's weight, the same on every response token of the row
        seq = sequence_logprobs(x.logprobs, w)
        value, g, right = prepared.unbind(-1)
        loss = (weight * value + 2 * weight * g * (seq - seq.detach())).sum()
        # Statistics are divided by the channel's tokens: scaled here so that gives the mean per pair.
        return loss, {"dpo/accuracy": (right * (weight != 0)).sum() * self.tokens_per_pair}


"""The `dpo` channel: Direct Preference Optimization on (chosen, rejected) pairs (Rafailov et al.).

    L = - log sigma( beta * [ (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l)) ] )

with log pi(y) the sequence log-prob summed over the response tokens (the tokens the channel
weights), beta = 0.1 by default (TRL's), and log pi_ref(y) from `trainer.loss.dpo.reference`:

    "dataset"  the pair's `ref_logp`, computed once by the dataset's reference when the pairs were made
    "initial"  a no-grad forward of the run's frozen initial weights over the same weighted tokens
    "recent"   the same with a snapshot of the policy taken every `ref_every` steps: at step s the
               reference is the policy of step N * floor(s / N), N = ref_every (semi-online DPO:
               the margin is measured from where the policy was at most N - 1 steps ago, not from
               where it started)

The last two score exactly the tokens the row weights (a row masked to the divergence tokens,
orchestrator.replay.divergence_tokens, gets its reference over those tokens; the dataset's number
covers the whole reply, so that combination is refused at launch).

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

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from composer_prime.config.base import FieldError
from composer_prime.contract.batches import Batch, Sample
from composer_prime.contract.dpo import check_pairs, check_row, pair_weight
from composer_prime.trainer.data import MicroBatch, collate
from composer_prime.trainer.loss import Channel, Context, LossInputs, token_logprobs
from composer_prime.trainer.loss.distill_teacher import ema_update


class DPOLossConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    beta: float = Field(0.1, gt=0, description="DPO's beta: how far from the reference the margin is measured")
    score_batch: int = Field(16, ge=1, description="rows per no-grad forward when scoring the pairs at the step's start")
    reference: Literal["dataset", "initial", "recent"] = Field(
        "dataset", description="log pi_ref: the pair's own ref_logp (dataset), the run's frozen initial weights "
                               "(initial), or a snapshot of the policy every ref_every steps (recent)")
    ref_every: int = Field(5, ge=1, description="recent: the reference at step s is the policy of step "
                                                "ref_every * floor(s / ref_every)")


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
        self.snapshot = ctx.frozen_copy() if ctx is not None and cfg.reference == "recent" else None
        self.ref_step: int | None = None  # the policy step the snapshot holds

    def normaliser(self) -> str:
        return "sequences"

    @classmethod
    def check_run(cls, cfg: DPOLossConfig, orchestrator) -> None:
        replay = orchestrator.section("replay")
        if replay.dataset is not None and replay.divergence_tokens and cfg.reference == "dataset":
            raise FieldError("reference", '"dataset": the pair\'s ref_logp covers the whole reply, and '
                             "orchestrator.replay.divergence_tokens masks it (use \"initial\" or \"recent\")")

    def reference_model(self, step: int) -> torch.nn.Module | None:
        """The module scoring log pi_ref at `step` (None: the rows' own ref_logp). The recent snapshot
        is refreshed when N * floor(step / N) moves; its first value is what it holds already: the
        initial weights, or on a resumed run the snapshot restored from the checkpoint."""
        if self.cfg.reference == "dataset":
            return None
        if self.cfg.reference == "initial":
            return self.ctx.frozen_initial()
        due = self.cfg.ref_every * (step // self.cfg.ref_every)
        if self.ref_step is not None and due != self.ref_step:
            ema_update(self.snapshot, self.ctx.policy, 1.0)  # rate 1: an exact copy (lerp's end - (end - start) * 0)
        self.ref_step = due
        return self.snapshot

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"DPO reference": self.snapshot} if self.snapshot is not None else {}

    def check(self, sample: Sample) -> None:
        check_row(sample)

    def check_batch(self, batch: Batch) -> None:
        check_pairs(batch.samples)

    def begin(self, batch: Batch) -> None:
        """Score every weighted dpo row with the current policy; margins, losses and gradient coefficients per pair."""
        rows = [s for s in batch.samples if "dpo" in s.channel_data and pair_weight(s) != 0]
        beta, self.pairs = self.cfg.beta, {}
        policy, ref = self.ctx.policy, self.reference_model(batch.step)
        with torch.no_grad():
            for i in range(0, len(rows), self.cfg.score_batch):
                chunk = rows[i:i + self.cfg.score_batch]
                mb = collate(chunk, self.ctx.pad_id, ["dpo"], self.ctx.device, self.ctx.share_cap)
                seqs, refs = (sequence_logprobs(token_logprobs(mb.logits(m), mb.input_ids[:, 1:], mb.temperature),
                                                mb.channel_weights["dpo"]).tolist() if m is not None else None
                              for m in (policy, ref))
                for row, d in mb.channel_data["dpo"]:  # the micro-batch's row order (shared rows regroup the chunk)
                    self.pairs.setdefault(d["pair"], {})["w" if d["chosen"] else "l"] = (
                        seqs[row], refs[row] if refs is not None else d["ref_logp"])
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


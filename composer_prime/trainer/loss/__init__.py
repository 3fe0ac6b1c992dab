"""Loss channels: the plug-in point of the algorithm-blind trainer.

Per token the trainer has the policy's log-prob, the sampler's log-prob, an advantage and a
weight per channel; per sample, what a channel needs beyond that travels in
`Sample.channel_data[name]`. A channel is one module defining a `Channel` subclass: its config
section (`trainer.loss.<name>`), what it checks on arrival, what it prepares per micro-batch
(reference log-probs, teacher targets), its loss, what it does after the optimizer step (an
EMA), which modules it adds to checkpoints, and what its loss is divided by. It checks its data
on arrival, per sample and across samples (a DPO pair's two rows). It is registered by
one entry point in the `composer_prime.loss_channels` group (pyproject.toml), or, for a module
outside the package, by naming it in `trainer.loss.plugins` ("module:Class").

    total = sum_c  scale_c * L_c / N_c

where L_c is the channel's summed loss, N_c its count over the whole batch on all ranks (tokens
or sequences, as the channel says) and scale_c = `trainer.loss.weights[c]` (1 if unset).
`Objective` runs the channels; `train_step` never names one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict

from composer_prime.contract.batches import Batch, Sample, SchemaError
from composer_prime.model.logprobs import token_logprobs  # every channel's helper; the warm start's too

if TYPE_CHECKING:
    from composer_prime.config.models import LossConfig
    from composer_prime.trainer.data import MicroBatch

__all__ = ["Channel", "Context", "Counts", "LossInputs", "Objective", "token_logprobs"]


@dataclass
class LossInputs:
    """One micro-batch's forward pass, every tensor [B, T-1] aligned with the predicted tokens."""

    logprobs: torch.Tensor  # pi, with grad
    old_logprobs: torch.Tensor  # pi_old: the policy before this step's update (detached)
    sampling_logprobs: torch.Tensor  # mu: what inference sampled with
    advantages: torch.Tensor
    logits: torch.Tensor | None = None  # [B, T-1, V] student logits, with grad


@dataclass
class Counts:
    """Per channel, over the whole batch on all ranks: weighted tokens and sequences."""

    tokens: dict[str, int]
    sequences: dict[str, int]

    @classmethod
    def of(cls, batch: Batch) -> "Counts":
        return cls(batch.channel_token_counts(), batch.channel_sequence_counts())


class Context:
    """What channels may use from the trainer: the policy, where its weights came from, and the
    frozen initial weights (built once, sharded like the policy, shared by every channel that
    asks: the k3 reference and a frozen teacher are the same weights)."""

    def __init__(self, policy: torch.nn.Module, model_dir: str, pad_id: int, share_cap: int | None = None,
                 compute_dtype: torch.dtype = torch.float32) -> None:
        self.policy, self.model_dir, self.pad_id = policy, model_dir, pad_id
        self.share_cap = share_cap  # the trainer's: a channel's own forwards group shared prefixes as the trainer does
        self.compute_dtype = compute_dtype  # the policy's: frozen copies compute as it does
        self._frozen: torch.nn.Module | None = None

    def frozen_initial(self) -> torch.nn.Module:
        if self._frozen is None:
            self._frozen = self.frozen_copy()
        return self._frozen

    def frozen_copy(self) -> torch.nn.Module:
        """A fresh frozen copy of the initial weights, sharded like the policy (an EMA starts as one).
        Imported here: transformers and FSDP take seconds, and a config check needs neither."""
        from composer_prime.trainer.model import frozen_copy

        mesh = next(self.policy.parameters()).device_mesh  # the policy's own (a DTensor's): built once, by the trainer
        return frozen_copy(self.model_dir, mesh, self.compute_dtype)

    @property
    def device(self) -> str:
        return next(self.policy.parameters()).device.type


class NoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Channel:
    """A loss channel. Subclasses set `name` and `Config` and override what they need; every
    hook that runs a forward pass runs on every rank alike (FSDP's collectives)."""

    name: ClassVar[str]
    Config: ClassVar[type[BaseModel]] = NoConfig

    def __init__(self, cfg: BaseModel, ctx: Context | None = None) -> None:
        self.cfg, self.ctx = cfg, ctx

    def normaliser(self) -> Literal["tokens", "sequences"]:
        """What the summed loss is divided by: the batch's weighted tokens or sequences."""
        return "tokens"

    def denominator(self, counts: Counts) -> int:
        """The count the summed loss is divided by (by default this channel's own, per `normaliser`)."""
        return counts.sequences.get(self.name, 0) if self.normaliser() == "sequences" else counts.tokens[self.name]

    @classmethod
    def check_run(cls, cfg: BaseModel, orchestrator: Any) -> None:
        """At launch: raise ValueError if this channel's settings contradict the orchestrator's."""

    def check(self, sample: Sample) -> None:
        """Validate (and parse in place) this channel's `channel_data` on arrival; raise SchemaError."""

    def check_batch(self, batch: Batch) -> None:
        """Validate what spans samples (a pair's two rows) once every sample passed `check`."""

    def begin(self, batch: Batch) -> None:
        """Once per step, before the micro-batches; the same batch on every rank."""

    def prepare(self, mb: MicroBatch, x: LossInputs) -> Any:
        """Per micro-batch, no-grad extras for `loss` (reference log-probs, teacher targets)."""
        return None

    def loss(self, x: LossInputs, w: torch.Tensor, prepared: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(summed loss over the weighted tokens, summed statistics named `<name>/...` or plain)."""
        raise NotImplementedError

    def after_step(self) -> None:
        """After the optimizer step (e.g. move an EMA teacher)."""

    def modules(self) -> dict[str, torch.nn.Module]:
        """Extra modules this channel saves in checkpoints, by a readable label ("EMA teacher")."""
        return {}


class Objective:
    """The configured channels, run as one loss."""

    def __init__(self, cfg: LossConfig, ctx: Context | None = None) -> None:
        self.scales = dict(cfg.weights)
        self.channels: dict[str, Channel] = {name: cls(cfg.section(name), ctx) for name, cls in cfg.channel_classes().items()}

    def check(self, batch: Batch) -> None:
        for s in batch.samples:
            for name in {*s.channel_weights, *s.channel_data}:
                if name not in self.channels:
                    raise SchemaError(f"unknown loss channel '{name}' (this trainer has: {', '.join(self.channels)})")
            for name in s.channel_data:
                self.channels[name].check(s)
        for ch in self.channels.values():
            ch.check_batch(batch)

    def active(self, counts: Counts) -> list[Channel]:
        """Channels with weighted tokens in this batch and a non-zero scale (equal on every rank)."""
        for name in counts.tokens:
            if name not in self.channels:
                raise ValueError(f"unknown loss channel '{name}' (known: {', '.join(self.channels)})")
        return [c for n, c in self.channels.items() if counts.tokens.get(n, 0) > 0 and self.scales.get(n, 1.0) != 0]

    def loss(self, x: LossInputs, weights: dict[str, torch.Tensor], counts: Counts,
             prepared: dict[str, Any] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        total = x.logprobs.new_zeros(())
        stats: dict[str, torch.Tensor] = {}
        prepared = prepared or {}
        for ch in self.active(counts):
            n_tokens = counts.tokens[ch.name]
            loss, extra = ch.loss(x, weights[ch.name], prepared.get(ch.name))
            denom = ch.denominator(counts)
            stats |= {k: v / n_tokens for k, v in extra.items()}  # statistics are per token (channels name them apart)
            stats[f"loss/{ch.name}"] = loss.detach() / denom
            total = total + self.scales.get(ch.name, 1.0) * loss / denom
        return total, stats

    def after_step(self) -> None:
        for ch in self.channels.values():
            ch.after_step()

    def modules(self) -> dict[str, torch.nn.Module]:
        return {f"{n}:{label}": m for n, ch in self.channels.items() for label, m in ch.modules().items()}

"""A loss channel defined outside the package, for tests: plain likelihood on a marked span.

    L_span = - sum_t w_t * log pi(y_t)          over the tokens of the marked span

`channel_data["span"] = [start, end]` marks the span; on arrival the channel checks that its
weights cover exactly that span. It also keeps a module in checkpoints (how many optimizer steps
it has seen) and moves it after every step, so the test sees every hook of the plug-in API run
inside a real trainer without a line of the package changed.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from composer_prime.contract.batches import Sample, SchemaError
from composer_prime.trainer.loss import Channel, LossInputs


class SpanConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_len: int = Field(1, ge=1)


class StepCounter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.long))


class SpanChannel(Channel):
    name = "span"
    Config = SpanConfig

    def __init__(self, cfg: SpanConfig, ctx=None) -> None:
        super().__init__(cfg, ctx)
        self.counter = StepCounter()

    def check(self, sample: Sample) -> None:
        start, end = sample.channel_data["span"]
        marked = [i for i, w in enumerate(sample.channel_weights.get("span", [])) if w != 0]
        if end - start < self.cfg.min_len or marked != list(range(start, end)):
            raise SchemaError(f"span [{start}, {end}) does not match its weights {marked[:3]}...")

    def loss(self, x: LossInputs, w: torch.Tensor, prepared: None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        with torch.no_grad():
            hits = ((x.logprobs > -2.0) & (w != 0)).sum().float()  # tokens the policy gives p > e^-2
        return -(x.logprobs * w).sum(), {"span/hits": hits}

    def after_step(self) -> None:
        self.counter.count += 1

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"steps seen": self.counter}

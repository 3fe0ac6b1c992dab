"""The sampling parameters of a generation request: one type from the config to the engine.

The orchestrator's `[orchestrator.sampling]` section is one; each request the orchestrator makes
is a copy with its own token budget and seed; the token route (/inference/v1/generate) carries
it as JSON and the server hands it to the engine as it came; the OpenAI routes read the same
fields from their body (`from_openai`). Temperature 0 is greedy (evaluation); log-probs are
always those of the distribution sampled from (logits / temperature), which is why the RL
config's section (`RolloutSampling`, the same type narrowed) insists on a temperature above 0.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(16, ge=1, description="tokens per model turn")
    temperature: float = Field(1.0, ge=0, description="sampling temperature (the trainer uses the same; 0 = greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    seed: int | None = Field(None, description="None: each rollout turn draws its own seed from the run's `seed`")
    stop_token_ids: tuple[int, ...] = Field((), description="stop tokens (none: the tokenizer's end of sequence)")

    @classmethod
    def from_openai(cls, body: dict, default_max_tokens: int = 64) -> SamplingParams:
        """The fields of an OpenAI completions or chat body (the rest of it is not sampling)."""
        return cls(max_tokens=int(body.get("max_tokens") or body.get("max_completion_tokens") or default_max_tokens),
                   temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                   seed=body.get("seed"), stop_token_ids=tuple(body.get("stop_token_ids") or ()))

    def or_eos(self, eos_token_id: int | None) -> SamplingParams:
        """No stop tokens given: stop at the tokenizer's end of sequence (`[-1]` stops nowhere)."""
        if self.stop_token_ids or eos_token_id is None:
            return self
        return self.model_copy(update={"stop_token_ids": (eos_token_id,)})


class RolloutSampling(SamplingParams):
    """The orchestrator's section: the same parameters, sampled (not greedy), since the trainer
    recomputes log-probs of logits / temperature."""

    temperature: float = Field(1.0, gt=0, description="sampling temperature (the trainer uses the same)")

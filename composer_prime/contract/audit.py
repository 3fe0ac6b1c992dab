"""Orchestrator <-> a trusted inference server: the audit of a volunteer's completion.

The validator (volunteer/validator.py) asks a trusted server to measure a submission
(`AuditRequest`, POST /inference/v1/audit); the server answers raw measurements (`AuditAnswer`):
one TOPLOC check per proof chunk against its own prefill, and the sampling checks (verify/
sampling.py). The validator applies the thresholds. `dtype` goes out as the run's audit dtype and
comes back as the one the prefill used, which picks the thresholds.

What a volunteer claimed is bounded here too (each proof at most PROOF_MAX_CHARS, token ids within
range, finite log-probs: a 42.7 MB proof once cost 13 s of trusted audit, issue 43), and the answer
carries the trusted log-prob of every completion token: an accepted volunteer's rollout trains on
those, not on the ones it claimed (which may sit up to `logprob_tol` off them).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from composer_prime.contract.volunteer import MAX_TOKEN_ID, PROOF_MAX_CHARS


class AuditRequest(BaseModel):
    """A volunteer's completion to measure: prompt + completion ids, its proofs and claims."""

    model_config = ConfigDict(extra="forbid")

    weight_version: int  # the weights it claims: measured only against those (409 otherwise)
    token_ids: list[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]]
    prompt_len: int = Field(ge=1)
    proofs: list[Annotated[str, Field(max_length=PROOF_MAX_CHARS)]]
    logprobs: list[Annotated[float, Field(le=0.0, allow_inf_nan=False)]]
    seed: int
    sampling_params: dict  # the lease's SamplingParams as JSON (the server reads it as SamplingParams)
    dtype: Literal["float32", "bfloat16"] | None = None  # the prefill's (None: the served one); the answer says which


class Chunk(BaseModel):
    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float


class AuditAnswer(BaseModel):
    """What the trusted prefill measured (verify/toploc.py, verify/sampling.py)."""

    weight_version: int
    dtype: str | None
    chunks: list[Chunk]
    logprob_max_err: float
    replay_mismatches: int
    max_draw_distance: float
    tokens: int
    min_pvalue: float = 1.0
    surprisal_z: float = 0.0
    logprobs: list[float]  # the trusted sampling log-prob of each completion token (what the trainer uses)

    @model_validator(mode="after")
    def _one_logprob_per_token(self) -> "AuditAnswer":
        if len(self.logprobs) != self.tokens:
            raise ValueError(f"{len(self.logprobs)} trusted log-probs for {self.tokens} tokens")
        return self


class AuditRefused(ValueError):
    """The server could not measure the submission (ids outside the vocabulary, unreadable proofs)."""

"""Orchestrator <-> a trusted inference server: the audit of a volunteer's completion.

The validator (volunteer/validator.py) asks a trusted server to measure a submission
(`AuditRequest`, POST /inference/v1/audit); the server answers raw measurements (`AuditAnswer`):
one TOPLOC check per proof chunk against its own prefill, and the sampling checks (verify/
sampling.py). The validator applies the thresholds. `dtype` goes out as the run's audit dtype and
comes back as the one the prefill used, which picks the thresholds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class AuditRequest(BaseModel):
    """A volunteer's completion to measure: prompt + completion ids, its proofs and claims."""

    model_config = ConfigDict(extra="forbid")

    weight_version: int  # the weights it claims: measured only against those (409 otherwise)
    token_ids: list[int]
    prompt_len: int = Field(ge=1)
    proofs: list[str]
    logprobs: list[float]
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


class AuditRefused(ValueError):
    """The server could not measure the submission (ids outside the vocabulary, unreadable proofs)."""

"""`[orchestrator.volunteers]`: untrusted machines that join a run as inference nodes (issue 27).

The orchestrator runs a pool (volunteer/pool.py) that workers (`uv run worker`) join with
the run's join token; a joined node takes leases (a prompt, sampling parameters and a seed chosen
by the pool), generates with TOPLOC proofs and submits; the validator (orchestrator/filters/
volunteers.py) admits a completion only when every check passes. Defaults and their sources:

- heartbeat every 2 s, dead after 3 missed: Prime Intellect's protocol (10 s, 3 missed), scaled
  to one machine (DESIGN.md, Volunteers);
- TOPLOC thresholds: calibrated on our models (benchmarks/volunteers.py --result calibration,
  docs/volunteers.md); the paper's 38 / 10 / 8 let one changed token through on a toy model;
- float32 audits whatever the run serves in: bfloat16 audits let weights within its noise through;
- log-prob tolerance and replay margin: calibrated the same way;
- ejected at 2 strikes, counted per volunteer (every key of an invite together): a failed check is
  a strike (one can be bad luck at a threshold, two are a pattern), and it costs the run its whole
  group (the `unverified` filter drops it); a lease lost (its deadline passed, or its node fell
  silent) costs the run its whole request (the client sends every lease of it again), so it is
  charged a quarter strike per lease of that request: a group's 8 leases, hoarded whole or one of
  them, eject; a submission checked too late (the trusted servers had moved on) a quarter strike.
  What honest work earns back is bounded (issue 43): a group's worth of accepted submissions
  (`group_size` of them) takes half a strike off, and never the half of a rejection's or a withheld
  lease's charge that is kept (`strike_kept`); so a volunteer that vetoes groups with one junk
  lease each, or sits on one lease of a group, is ejected by its fourth veto, its first hoarded
  request, however much honest work it does between them (an honest node's miss fades; a cheat
  that passes with probability p gains (1 - p) - p/16 strikes a lease);
- on probation for its first 16 accepted submissions: one request (a group's leases) in flight;
- the run starts stepping at once (`wait_for` 0): an operator who wants its first steps sampled by k
  volunteers too sets `wait_for = k`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit
from typing import Literal

from pydantic import Field, model_validator

from composer_prime.config.base import FieldError, Port, Strict
from composer_prime.transports.auth import is_loopback


class Thresholds(Strict):
    """What a submission may differ by from the trusted prefill (calibrated per dtype, above)."""

    max_exp_mismatches: int = Field(ge=0, description="TOPLOC: exponent mismatches a chunk may have (of 128)")
    max_mant_mean: float = Field(ge=0, description="TOPLOC: mean mantissa error a chunk may have")
    max_mant_median: float = Field(ge=0, description="TOPLOC: median mantissa error a chunk may have")
    logprob_tol: float = Field(gt=0, description="max |claimed - trusted| sampling log-prob")
    replay_margin: float = Field(ge=0, le=1, description="how far (a fraction of the probability mass) a token's "
                                                          "CDF interval may lie from its seeded draw")
    min_pvalue: float = Field(1e-4, ge=0, le=1, description="a sampler no one can replay (vLLM's): n x the "
                                                           "smallest p-value of its tokens may not be below this")
    min_surprisal_z: float = Field(-4.5, le=0, description="a sampler no one can replay: its tokens' summed "
                                                           "surprisal may not lie this many standard deviations "
                                                           "below draws' (tokens picked, not drawn)")

    def chunk_passes(self, chunk: Mapping[str, float]) -> bool:
        """A TOPLOC chunk's measurements (verify/toploc.py `ChunkCheck`) within the thresholds."""
        return (chunk["exp_mismatches"] <= self.max_exp_mismatches and chunk["mant_err_mean"] <= self.max_mant_mean
                and chunk["mant_err_median"] <= self.max_mant_median)


# benchmarks/volunteers.py --result calibration, 2026-11-25 (docs/volunteers.md): 160 honest rollouts per model
# and setting on this machine kind, the validator on this machine's kernels and on AVX2 ones, workers on the
# embedded engine and on vLLM. A worker's proofs commit to the states it decoded (or, on vLLM, prefilled), the
# validator's to its prefill: in float32 the two round to the same bf16 values but for a few (2 exponent
# mismatches of 128 at most), in bfloat16 they do not (SmolLM2-135M: up to 13 mismatches, a mean mantissa error
# of 3.35, a median of 2; two prefills on different kernels differ as much), so bfloat16's TOPLOC thresholds sit
# above that: they catch another model, replayed proofs and a changed prompt token on SmolLM2, not weights 1e-3
# off (within the noise): why audits are float32 by default (`VolunteersConfig.dtype`). The sampler's log-probs
# and draws round apart by 4.5e-5 and 3.5e-6 of the mass at most in float32 (vLLM's logits against a prefill
# included), by 0.75 and 0.074 in bfloat16. The statistics' thresholds are set from their theory (honest worst
# over 1,280 rollouts: 0.0021 and -2.74).
CALIBRATED: dict[str, dict] = {
    "float32": {"max_exp_mismatches": 8, "max_mant_mean": 2.0, "max_mant_median": 1.0, "logprob_tol": 2e-4,
                "replay_margin": 1e-5},
    "bfloat16": {"max_exp_mismatches": 20, "max_mant_mean": 3.5, "max_mant_median": 3.0, "logprob_tol": 1.0,
                 "replay_margin": 0.15},
}


class VolunteersConfig(Strict):
    """The volunteer pool: join, heartbeats, leases, rate limits, validation thresholds."""

    enabled: bool = Field(False, description="run the pool; workers join with `uv run worker --join URL --token T`")
    host: str = Field("127.0.0.1", description="the pool's address (beyond loopback: needs `auth.keys_dir`)")
    port: Port = Field(8600, description="the pool's port")
    tls: bool | None = Field(None, description="serve the pool over HTTPS, its self-signed certificate pinned by "
                                               "every token; None: beyond loopback only (where it cannot be off)")
    open: bool = Field(False, description="an open run: anyone with the run's one token joins (within the "
                                          "limits below, on probation); else only workers with an invite "
                                          "(`composer-prime volunteers invite NAME --run OUTPUT_DIR`)")
    join_token: str | None = Field(None, description="an open run's token; None: made at start and written to "
                                                     "<output_dir>/orchestrator/volunteers.token")
    keys_per_invite: int = Field(8, ge=1, description="nodes (keys) one invite may have in the pool")
    members_per_address: int = Field(16, ge=1, description="an open run: nodes one source address may have")
    max_members: int = Field(1024, ge=1, description="nodes the pool keeps (a silent one makes room; else refused)")
    join_rate: float = Field(1.0, gt=0, description="joins per second per invite, or from one source address "
                                                    "for an open run's token and wrong ones (a bucket of `join_burst`)")
    join_burst: int = Field(20, ge=1, description="the join bucket's size")
    address_rate: float = Field(50.0, gt=0, description="refused heartbeat, lease and submit requests per second "
                                                        "from one source address (not a member's, malformed, a "
                                                        "bad signature, a replay); more: 429 before any check")
    address_burst: int = Field(200, ge=1, description="the refusals bucket's size")
    heartbeat_s: float = Field(2.0, gt=0, description="a worker beats this often")
    dead_after: int = Field(3, ge=1, description="missed heartbeats after which a node is dead (its leases go "
                                                 "to other nodes)")
    lease_s: float = Field(60.0, gt=0, description="a lease's deadline: a later submission is discarded and the "
                                                   "task goes to another node")
    rate: float = Field(200.0, gt=0, description="requests per second a node may make (token bucket); more: 429")
    burst: int = Field(400, ge=1, description="the bucket's size")
    samplers: list[Literal["seeded", "any"]] = Field(["seeded"], description="samplers a submission may declare: "
                                                     "seeded (the run's seeded sampler, either engine: its draws are "
                                                     "replayed); add any to accept vLLM's own sampler, tested "
                                                     "statistically (a substituted plausible token or the likeliest "
                                                     "tokens of a confident model pass: docs/volunteers.md)")
    eject_after: float = Field(2.0, gt=0, description="strikes at which a node is ejected and its key refused: "
                                                      "a failed check is one")
    strike_missed: float = Field(0.25, ge=0, description="strikes for a lease whose deadline passed (hoarded, or "
                                                        "held by a node that went silent)")
    strike_unverifiable: float = Field(0.25, ge=0, description="strikes for a submission no trusted server could "
                                                              "check any more (it came after they moved on)")
    strike_decay: float = Field(0.5, ge=0, description="strikes taken off by a group's worth of accepted "
                                                       "submissions (the orchestrator's `group_size`; each its share)")
    strike_kept: float = Field(0.5, ge=0, le=1, description="the share of a rejection's or a withheld lease's "
                                                            "strikes that accepted work never takes off")
    probation_accepted: int = Field(16, ge=0, description="accepted submissions before a new node leaves probation")
    probation_requests: int = Field(1, ge=1, description="requests (a group's leases each) a node on probation "
                                                         "may have in flight")
    wait_for: int = Field(0, ge=0, description="volunteers (healthy nodes) the run waits for before its first "
                                               "step, its trusted servers and trainer up; 0: it starts at once. "
                                               "The wait counts in `watchdog.startup_s`")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="what workers generate in and the audits "
                                                  "prefill in, whatever the trusted servers serve in (a bfloat16 "
                                                  "server audits through a float32 copy of the weights): at "
                                                  "float32 the calibration caught every cheat; at bfloat16 weights "
                                                  "within its noise pass (docs/volunteers.md)")
    thresholds: dict[str, Thresholds] = Field(default_factory=lambda: {d: Thresholds(**t) for d, t in CALIBRATED.items()},
                                              description="the validator's thresholds per dtype of the audit "
                                                          "(float32, bfloat16); a key given replaces that "
                                                          "one value of the calibrated set")
    relays: list[str] = Field(default_factory=list, description="SHARDCAST servers workers pull weights from "
                                                                "(`rl` names the run's); none: the weights "
                                                                "directory, for workers on this machine")
    public_key: str = Field("", description="the trainer's ed25519 public key (hex, or its file), with `relays`")

    @model_validator(mode="after")
    def _nothing_in_clear(self) -> "VolunteersConfig":
        if self.tls is False and not is_loopback(self.host):
            raise FieldError("tls", f"is off but the pool listens on {self.host}, beyond loopback, where nothing "
                                    "travels in clear (prompts, leases, tokens): leave tls unset or true")
        return self

    def serves_tls(self) -> bool:
        return self.tls if self.tls is not None else not is_loopback(self.host)

    @model_validator(mode="after")
    def _token_means_open(self) -> "VolunteersConfig":
        if self.join_token is not None and not self.open:
            raise FieldError("join_token", "is an open run's one token: set volunteers.open = true too, or leave it "
                                           "out and invite each volunteer (composer-prime volunteers invite NAME)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _over_calibrated(cls, data: object) -> object:
        """The thresholds a config gives, each over the calibrated value it replaces."""
        if isinstance(data, dict) and isinstance(data.get("thresholds"), dict):
            given = data["thresholds"]
            data = {**data, "thresholds": {d: {**CALIBRATED.get(d, {}), **(t if isinstance(t, dict) else {})}
                                           for d, t in {**dict.fromkeys(CALIBRATED), **given}.items()}}
        return data

    def for_dtype(self, dtype: str | None) -> Thresholds:
        """The thresholds for an audit computed in `dtype` (the one the trusted server says it used)."""
        return self.thresholds[dtype if dtype in self.thresholds else self.dtype]


class WorkerConfig(Strict):
    """`uv run worker`: lend this machine to a run as an inference node (volunteer/worker.py)."""

    join: str = Field(min_length=1, description="the run's pool, e.g. http://127.0.0.1:8600")
    token: str | None = Field(None, description="the run's join token (or `token_file`)")
    token_file: Path | None = Field(None, description="a file holding the join token")
    key_path: Path = Field(Path("~/.config/composer-prime/worker.ed25519"), description="this node's ed25519 key "
                                                                                       "(made on first start, kept: "
                                                                                       "its public half is the node id)")
    work_dir: Path = Field(Path("outputs/worker"), description="downloaded weights")
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")
    engine: Literal["hf", "vllm"] = Field("hf", description="hf: the embedded engine; vllm: vLLM generates and one "
                                                         "prefill on the embedded engine gives the proofs' states and "
                                                         "the log-probs (the model is held twice)")
    draws: Literal["seeded", "engine"] = Field("seeded", description="vllm: seeded, the run's seeded sampler (the "
                                                                   "validator replays each draw); engine, vLLM's own "
                                                                   "(tested statistically: a plausible token put in "
                                                                   "place of a drawn one passes)")
    dtype: str = Field("auto", description="auto (the run's `volunteers.dtype`, which the audits compute in: "
                                           "a worker in another one is rejected), float32 or bfloat16")
    max_model_len: int = Field(2048, ge=16, description="prompt + completion tokens per sequence")
    concurrency: int = Field(8, ge=1, description="leases worked on at once (the engine decodes them as one batch)")
    max_leases: int = Field(0, ge=0, description="stop after this many submissions (0: until the run ends)")
    http_timeout_s: float = Field(120.0, gt=0, description="a request to the pool unanswered this long fails (a lease's "
                                                          "long poll is 5 s)")

    @model_validator(mode="after")
    def _check(self) -> "WorkerConfig":
        url = urlsplit(self.join)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise FieldError("join", f"{self.join} is not the pool's URL (http://HOST:PORT on loopback, else https://)")
        if url.scheme == "http" and not is_loopback(url.hostname):
            raise FieldError("join", f"{self.join} is beyond loopback, where the pool serves https only (nothing in "
                                     f"clear): https://{url.netloc}")
        if (self.token is None) == (self.token_file is None):
            raise FieldError("token", "give the join token as `token` or `token_file` (one of them)")
        if self.token_file is not None and not self.token_file.expanduser().is_file():  # said now, not after a minute
            raise FieldError("token_file", f"file not found: {self.token_file}; the run's operator makes one with "
                                           "`composer-prime volunteers invite NAME --run OUTPUT_DIR --out FILE` (an open "
                                           "run writes its token to <output_dir>/orchestrator/volunteers.token)")
        return self

    def join_token(self) -> str:
        return self.token if self.token is not None else self.token_file.expanduser().read_text().strip()

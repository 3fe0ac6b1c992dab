"""Validating a volunteer's submissions, and the filter that keeps rejected ones out of batches.

`Validator.check` runs on each submission as it arrives (orchestrator/client.py), before its
rollout goes on; the checks, cheapest first, each naming the rejection:

    signature     the submission is signed by the node it names
    unregistered  that node is a member of the pool, not ejected
    lease         it answers the lease given to that node; `prompt`: its prompt hash is the
                  leased prompt's (TOPLOC does not prove the prompt); `seed`: the leased seed
    sampler       it drew with a sampler the run accepts (`volunteers.samplers`)
    version       it used the leased weight version (any other, older or newer, the pool never
                  leased: rejected)
    malformed     tokens and log-probs agree, one proof per 32 tokens, no null proof, within
                  the leased token budget
    boundary      a whole completion: it ends in the lease's first stop token, or has none and
                  fills the leased budget (contract/inference.boundary_valid); else a worker could
                  cut a completion where it likes, or draw on past the stop token, all of it
                  replaying as honest draws, and choose among those per lease
    toploc        every chunk's proof within the calibrated thresholds, against one prefill
                  of prompt + tokens on a trusted server (/inference/v1/audit), computed in
                  `volunteers.dtype` (the dtype workers are told to generate in)
    logprobs      claimed sampling log-probs within `logprob_tol` of the trusted ones
    sampling      each token is what the leased seed draws from the trusted distribution, within
                  `replay_margin`; from a sampler no one can replay (vLLM's, `sampler` "any"), the
                  tokens pass a test of being draws from it (verify/sampling.py)

Rewards are never a node's to report: the environment scores every rollout on the trusted side.
The pool counts each verdict per node, a rejection a strike, and ejects at `eject_after`
strikes (orchestrator/volunteers.py). A submission no trusted server serves the weights of any
more is `Unverifiable`: the task goes to another node, the node charged a fraction. A rejected
completion stays in its rollout, flagged, and `Unverified` drops its group (counted in rollouts,
`unverified`): nothing a node sent reaches a batch unless it passed. `attach` wires the pool
and this validator into the orchestrator's InferenceClient.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

from composer_prime.config.models import OrchestratorConfig
from composer_prime.config.volunteers import VolunteersConfig
from composer_prime.contract.batches import SchemaError
from composer_prime.contract.inference import boundary_valid
from composer_prime.contract.volunteer import Lease, Submission, check_submission
from composer_prime.orchestrator.filters import Filter
from composer_prime.orchestrator.volunteers import Unverifiable, VolunteerPool
from composer_prime.transports import auth
from composer_prime.volunteer.invites import Invites, store_path
from composer_prime.volunteer.tls import cert_dir, ensure_cert, pinned_token

log = logging.getLogger(__name__)


class Validator:
    def __init__(self, cfg: VolunteersConfig, is_member: Callable[[str], bool],
                 audit: Callable[[dict], Awaitable[dict | None]]) -> None:
        """`audit(body)`: the trusted server's /inference/v1/audit answer, None when it serves other weights."""
        self.cfg, self.is_member, self.audit = cfg, is_member, audit

    async def check(self, lease: Lease, s: Submission) -> str:
        """"" when the submission passes, else the name of the first check it fails."""
        if not s.signature_valid():
            return "signature"
        if not self.is_member(s.node_id):
            return "unregistered"
        if s.lease_id != lease.lease_id:
            return "lease"
        if s.prompt_sha256 != lease.prompt_sha256:
            return "prompt"
        if s.seed != lease.sampling.get("seed"):
            return "seed"
        if s.sampler not in self.cfg.samplers:
            return "sampler"
        if s.weight_version != lease.weight_version:  # a version the pool never leased: a free abort otherwise
            return "version"
        try:
            check_submission(s)
        except SchemaError:
            return "malformed"
        if len(s.token_ids) > lease.sampling.get("max_tokens", len(s.token_ids)):
            return "malformed"
        if not boundary_valid(s.token_ids, lease.sampling.get("stop_token_ids", ()), lease.sampling.get("max_tokens", 0)):
            return "boundary"
        m = await self.audit({"weight_version": s.weight_version, "token_ids": lease.prompt_ids + s.token_ids,
                              "prompt_len": len(lease.prompt_ids), "proofs": s.proofs, "logprobs": s.logprobs,
                              "seed": s.seed, "sampling_params": lease.sampling, "dtype": self.cfg.dtype})
        if m is None:
            raise Unverifiable(f"no trusted server serves v{s.weight_version} any more")
        if "error" in m:  # the server could not measure it: ids outside the vocabulary, unreadable proofs
            return "malformed"
        c = self.cfg.for_dtype(m.get("dtype"))
        if not all(c.chunk_passes(x) for x in m["chunks"]):
            return "toploc"
        if m["logprob_max_err"] > c.logprob_tol:
            return "logprobs"
        if s.sampler == "seeded" and m["max_draw_distance"] > c.replay_margin:
            return "sampling"
        if s.sampler != "seeded" and (m["min_pvalue"] < c.min_pvalue or m["surprisal_z"] < c.min_surprisal_z):
            return "sampling"
        return ""


def attach(cfg: OrchestratorConfig, client) -> VolunteerPool | None:
    """The run's pool and validator, wired into `client`, when `orchestrator.volunteers.enabled`."""
    v = cfg.volunteers
    if not v.enabled:
        return None
    token = v.join_token
    join = f"uv run worker --join {'https' if v.serves_tls() else 'http'}://{v.host}:{v.port} --token_file"
    if v.open and token is None:  # made once per run directory, kept across restarts: joined workers keep working
        path = (cfg.auth.keys_dir or Path(cfg.output_dir) / "orchestrator") / "volunteers.token"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(pinned_token(secrets.token_urlsafe(24), cfg.output_dir))
        token = path.read_text().strip()
        log.info(f"an open run: volunteers join with: {join} {path}")
    elif not v.open:
        log.info(f"volunteers join with an invite: uv run composer-prime volunteers invite NAME --run {cfg.output_dir} "
                 f"--out NAME.token, then {join} NAME.token")
    weights = ({"type": "shardcast", "servers": v.relays, "public_key": auth.public_key(v.public_key)} if v.relays
               else {"type": "filesystem", "root": str(Path(cfg.output_dir).resolve() / "weights")})
    tls = ensure_cert(cert_dir(cfg.output_dir)) if v.serves_tls() else None  # the certificate every token pins
    pool = VolunteerPool(v, client.pool, token, weights, cfg.model, Invites(store_path(cfg.output_dir)), tls)
    client.volunteers = (pool, Validator(v, pool.is_member, client.audit))
    return pool


class Unverified(Filter):
    """A group with any completion the validator rejected is dropped, counted in rollouts."""

    name = "unverified"
    order = 5  # before staleness: a rejected rollout is never counted as merely stale

    @classmethod
    def active(cls, cfg) -> bool:
        return cfg.volunteers.enabled

    def keeps(self, step, group, shaped) -> bool:
        return not any(r.unverified for r in group)

    def count(self, group) -> int:
        return len(group)

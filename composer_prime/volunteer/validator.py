"""Validating a volunteer's submissions (the filter that keeps rejected ones out of batches is
orchestrator/filters/volunteers.py).

`Validator.check` runs on each submission as it arrives (volunteer/node.py), before its rollout
goes on; the checks, cheapest first, each naming the rejection:

    signature     the submission is signed by the node it names
    unregistered  that node is a member of the pool, not ejected
    lease         it answers the lease given to that node; `prompt`: its prompt hash is the
                  leased prompt's (TOPLOC does not prove the prompt); `seed`: the leased seed
    sampler       it drew with a sampler the run accepts (`volunteers.samplers`)
    version       it used the leased weight version (any other, older or newer, the pool never
                  leased: rejected)
    malformed     every field of its type and size (contract/volunteer.check_submission: wrong JSON
                  types are this verdict, never a TypeError in the orchestrator), tokens and log-probs
                  agree, one proof per 32 tokens, each of 2 + 2k bytes with a nonzero modulus, no null
                  proof, within the leased token budget (the door refused all of these already, with
                  the same strike; this is the validator's own line)
    boundary      a whole completion: it ends in the lease's first stop token, or has none and
                  fills the leased budget (contract/inference.boundary_valid); else a worker could
                  cut a completion where it likes, or draw on past the stop token, all of it
                  replaying as honest draws, and choose among those per lease
    toploc        every chunk's proof within the calibrated thresholds, against one prefill
                  of prompt + tokens on a trusted server (/inference/v1/audit), computed in
                  `volunteers.dtype` (the dtype workers are told to generate in)
    logprobs      claimed sampling log-probs within `logprob_tol` of the trusted ones; an accepted
                  rollout then carries the trusted ones (`Verdict.logprobs`), which the trainer's
                  importance ratios use: a claim may sit up to the tolerance off (issue 43)
    sampling      each token is what the leased seed draws from the trusted distribution, within
                  `replay_margin`; from a sampler no one can replay (vLLM's, `sampler` "any"), the
                  tokens pass a test of being draws from it (verify/sampling.py)

Rewards are never a node's to report: the environment scores every rollout on the trusted side.
The pool counts each verdict per node, a rejection a strike, and ejects at `eject_after`
strikes (volunteer/pool.py). A submission no trusted server serves the weights of any more is
`Unverifiable`: the task goes to another node, the node charged a fraction. A rejected completion
stays in its rollout, flagged, and the `unverified` filter drops its group: nothing a node sent
reaches a batch unless it passed. The audit is the trusted servers' (the orchestrator's client
posts it), handed in as a callable: this side imports nothing of the client.
"""

from __future__ import annotations

from collections.abc import Callable

from composer_prime.config.volunteers import VolunteersConfig
from composer_prime.contract.audit import AuditAnswer, AuditRefused, AuditRequest
from composer_prime.contract.batches import SchemaError
from composer_prime.contract.inference import boundary_valid
from composer_prime.contract.volunteer import Lease, Submission, check_submission
from composer_prime.orchestrator.pool import Audit
from composer_prime.volunteer.members import Unverifiable


class Verdict(str):
    """A check's verdict, a string ("" accepted, else the first check failed) that also carries the trusted
    log-probs of the submission's tokens where the audit measured them (`logprobs`, else None)."""

    logprobs: list[float] | None

    def __new__(cls, reason: str, logprobs: list[float] | None = None) -> "Verdict":
        out = super().__new__(cls, reason)
        out.logprobs = logprobs
        return out


class Validator:
    def __init__(self, cfg: VolunteersConfig, is_member: Callable[[str], bool], audit: Audit) -> None:
        """`audit(request)`: a trusted server's measurements, None when none serves those weights any more;
        AuditRefused when it cannot measure the submission."""
        self.cfg, self.is_member, self.audit = cfg, is_member, audit

    async def check(self, lease: Lease, s: Submission) -> Verdict:
        """"" when the submission passes, else the name of the first check it fails; with the trusted
        log-probs where the audit measured them (an accepted one's always)."""
        reason, m = await self._check(lease, s)
        return Verdict(reason, m.logprobs if m is not None else None)

    async def _check(self, lease: Lease, s: Submission) -> tuple[str, AuditAnswer | None]:
        reason = self._cheap(lease, s)
        if reason:
            return reason, None
        try:
            m = await self.audit(AuditRequest(weight_version=s.weight_version, token_ids=lease.prompt_ids + s.token_ids,
                                              prompt_len=len(lease.prompt_ids), proofs=s.proofs, logprobs=s.logprobs,
                                              seed=s.seed, sampling_params=lease.sampling, dtype=self.cfg.dtype))
        except AuditRefused:  # the server could not measure it: ids outside the vocabulary, unreadable proofs
            return "malformed", None
        if m is None:
            raise Unverifiable(f"no trusted server serves v{s.weight_version} any more")
        c = self.cfg.for_dtype(m.dtype)
        if not all(c.chunk_passes(x.model_dump()) for x in m.chunks):
            return "toploc", m
        if m.logprob_max_err > c.logprob_tol:
            return "logprobs", m
        if s.sampler == "seeded" and m.max_draw_distance > c.replay_margin:
            return "sampling", m
        if s.sampler != "seeded" and (m.min_pvalue < c.min_pvalue or m.surprisal_z < c.min_surprisal_z):
            return "sampling", m
        return "", m

    def _cheap(self, lease: Lease, s: Submission) -> str:
        """The checks that cost no prefill, in order: "" when it passes them."""
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
        return ""

"""A volunteer as the orchestrator's client sees it: a `Node` of its NodePool (orchestrator/pool.py).

`complete` turns a request for n completions into n leases on this node (seed + i each: the pool
picks the seed, never the node), waits for the submissions, and has each checked by the validator
(volunteer/validator.py) before its caller gets it; the verdict rides on the completion (a rejected
one is flagged and its group dropped by the `unverified` filter), and an accepted one carries the
trusted log-probs the audit measured, not the node's claims (issue 43: a claim may sit up to the
validator's `logprob_tol` off, and the trainer's importance ratios read these). A lease lost, or a
submission no trusted server can check any more, is `NodeFailed`: the client gives the request to
the next node.
"""

from __future__ import annotations

import asyncio
import random

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Completion
from composer_prime.orchestrator.pool import Node
from composer_prime.volunteer.members import PREFIX, Unverifiable


class VolunteerNode(Node):
    trusted = False

    def __init__(self, node_id: str, pool) -> None:
        """`pool`: the VolunteerPool the node joined (volunteer/pool.py)."""
        self.node_id, self.pool, self.name = node_id, pool, PREFIX + node_id

    async def complete(self, prompt_ids: list[int], sampling: SamplingParams, n: int) -> list[Completion]:
        pool, node = self.pool, self.node_id
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(62)  # the pool's pick, never the node's
        async with pool.request(node):  # a node on probation: one request at a time
            got = await asyncio.gather(*(pool.lease(node, prompt_ids, sampling.model_copy(update={"seed": seed + i}),
                                                    pool.served()) for i in range(n)))
        out = []
        for lease, sub in got:
            try:
                verdict = await pool.validator.check(lease, sub)
            except Unverifiable:  # checked after the trusted servers moved on: slow, or hoarding; a fraction of a strike
                pool.charge(sub.node_id, "unverifiable", pool.cfg.strike_unverifiable)
                raise
            pool.verdict(sub.node_id, verdict)
            stopped = bool(sub.token_ids) and sub.token_ids[-1] in sampling.stop_token_ids
            trusted = getattr(verdict, "logprobs", None)  # the validator's Verdict; a test's stand-in may say none
            logprobs = sub.logprobs if verdict or trusted is None else trusted  # a rejected one's group is dropped
            out.append(Completion(sub.token_ids, logprobs, "stop" if stopped else "length", sub.weight_version,
                                  verdict=str(verdict)))
        return out

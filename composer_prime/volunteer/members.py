"""What the volunteer pool keeps of each node, and the ways a lease fails: shared by the pool's
bookkeeping (volunteer/pool.py), its routes (volunteer/door.py) and the node the client sees
(volunteer/node.py)."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from composer_prime.contract.volunteer import Lease
from composer_prime.orchestrator.pool import NodeFailed

PREFIX = "volunteer:"  # a volunteer's name in the NodePool


class LeaseLost(NodeFailed):
    """The node died, was ejected, is on probation with a request in flight, or missed the deadline."""


class Unverifiable(NodeFailed):
    """No trusted server holds the weights a submission used any more."""


@dataclass
class Member:
    node_id: str
    last_beat: float
    status: str = "healthy"  # healthy | dead | ejected
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    tokens: float = 0.0  # the rate limit's bucket
    refilled: float = 0.0
    invite: str = ""  # the invite it joined with ("" in an open run)
    address: str = ""  # the source address of its join
    counts: Counter = field(default_factory=Counter)  # leased, accepted, rejected:<why>, missed, limited, ...
    strikes: float = 0.0  # charged misbehaviour, less what accepted work took off
    in_flight: int = 0  # requests (a group's leases each) the client has given it now


@dataclass
class Pending:
    lease: Lease
    node_id: str
    future: asyncio.Future

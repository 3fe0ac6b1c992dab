"""What the volunteer pool keeps of each node, and the ways a lease fails: shared by the pool's
bookkeeping (volunteer/pool.py), its routes (volunteer/door.py) and the node the client sees
(volunteer/node.py).

A node's strikes live in its volunteer's `Record`: every key that joined with one invite shares
one record (issue 43: eight keys of one invite each taking a rejection are eight strikes of one
volunteer, not one strike of eight), an open run's node has a record of its own. A `Held` is one
request's leases (a group's, or a turn's): a lease lost costs the request it belongs to, since the
client sends all of it again (volunteer/pool.py). `Buckets` are the door's rate limits per invite or
source address (volunteer/door.py).
"""

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
class Record:
    """What a volunteer has been charged: `strikes` (ejected at `eject_after`), of which `floor` is
    what accepted work can no longer take off (a share of every rejection and withheld lease)."""

    strikes: float = 0.0
    floor: float = 0.0


@dataclass
class Held:
    """One request's leases to one node: how many, and whether losing one was charged already."""

    leases: int = 0
    charged: bool = False


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
    record: Record = field(default_factory=Record)  # its volunteer's: shared by every key of one invite
    in_flight: int = 0  # requests (a group's leases each) the client has given it now

    @property
    def strikes(self) -> float:
        """Its volunteer's strikes (every key of its invite together)."""
        return self.record.strikes


class Buckets:
    """A token bucket per key (`rate` per second, `burst`), at most `kept` keys (the longest-quiet forgotten)."""

    def __init__(self, rate: float, burst: int, kept: int = 4096) -> None:
        self.rate, self.burst, self.kept = rate, burst, kept
        self._b: dict[str, tuple[float, float]] = {}  # key -> (tokens, when)

    def tokens(self, key: str, now: float) -> float:
        """What `key`'s bucket holds at `now`."""
        tokens, then = self._b.pop(key, (float(self.burst), now))
        self._b[key] = (tokens := min(self.burst, tokens + (now - then) * self.rate), now)
        while len(self._b) > self.kept:
            del self._b[next(iter(self._b))]
        return tokens

    def take(self, key: str, now: float) -> bool:
        """Spend one of `key`'s tokens; False when it had none."""
        if (tokens := self.tokens(key, now)) < 1:
            return False
        self._b[key] = (tokens - 1, now)
        return True


@dataclass
class Pending:
    lease: Lease
    node_id: str
    future: asyncio.Future
    held: Held | None = None  # the request it belongs to (None: leased outside one)

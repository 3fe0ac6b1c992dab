"""Single-use hellos: the pool accepts each signed hello once (issue 36).

A hello (contract/volunteer.py) is signed over the node id, the route and the time, and expires
after `max_age_s`; within that window an exact copy used to pass. Ed25519 signatures are
deterministic, so a copy has the same signature: the pool remembers each signature it accepted
until its hello expires, and refuses it a second time. Memory is bounded per key: past `kept`
remembered hellos the oldest is forgotten and the key's floor rises to its time, so any hello of
that key made at or before the floor is refused too (a worker's hellos are made at the time they
are sent; one held back longer than the floor allows is simply sent again, freshly signed).
"""

from __future__ import annotations

import time
from collections import OrderedDict


class Replays:
    def __init__(self, max_age_s: float = 60.0, kept: int = 4096, keys: int = 65_536) -> None:
        self.max_age_s, self.kept, self.keys = max_age_s, kept, keys
        self._seen: OrderedDict[str, tuple[OrderedDict[str, float], list[float]]] = OrderedDict()

    def first_use(self, body: dict) -> bool:
        """True the first time this signed hello is seen (its signature already checked by the caller)."""
        key, signature, made = str(body["node_id"]), str(body["signature"]), float(body["time"])
        seen, floor = self._seen.get(key) or (OrderedDict(), [float("-inf")])
        self._seen[key] = (seen, floor)
        self._seen.move_to_end(key)
        now = time.time()
        while seen and next(iter(seen.values())) < now - self.max_age_s:  # expired: the age check refuses those
            seen.popitem(last=False)
        if signature in seen or made <= floor[0]:
            return False
        seen[signature] = made
        if len(seen) > self.kept:
            floor[0] = max(floor[0], seen.popitem(last=False)[1])
        while len(self._seen) > self.keys:  # the longest-quiet key forgotten (its hellos expire within a minute)
            self._seen.popitem(last=False)
        return True

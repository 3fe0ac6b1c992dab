"""Single-use hellos: the pool accepts each signed hello once (issue 36, issue 43).

A hello (contract/volunteer.py) is signed over the node id, the route and the time, and expires
after `max_age_s`; within that window an exact copy used to pass. Ed25519 signatures are
deterministic, so a copy has the same signature: the pool remembers each signature it accepted
until its hello expires, and refuses it a second time. It remembers the signature's bytes, not its
text: hex in upper case or with spaces decodes to the same bytes, and a copy re-cased was another
string (issue 43: a copied lease hello with its signature upper-cased took the victim's lease).

Memory is bounded per key: past `kept` remembered hellos the oldest is forgotten and the key's
floor rises to its time, so any hello of that key made at or before the floor is refused too (a
worker's hellos are made at the time they are sent; one held back longer than the floor allows is
simply sent again, freshly signed). And over keys: the pool remembers only its members' hellos
(volunteer/door.py checks membership first), at most `keys` keys, the longest-quiet forgotten
first. An entry is about 250 bytes: at the pool's defaults (2,048 keys of 1,024 hellos) at most
about 0.5 GB, and that only if every member sent 1,024 hellos within a minute.
"""

from __future__ import annotations

import time
from collections import OrderedDict


class Replays:
    def __init__(self, max_age_s: float = 60.0, kept: int = 1024, keys: int = 2048) -> None:
        self.max_age_s, self.kept, self.keys = max_age_s, kept, keys
        self._seen: OrderedDict[bytes, tuple[OrderedDict[bytes, float], list[float]]] = OrderedDict()

    def first_use(self, body: dict) -> bool:
        """True the first time this signed hello is seen (its signature already checked by the caller, so its
        node id and signature are hex; ValueError if not)."""
        key, signature, made = bytes.fromhex(body["node_id"]), bytes.fromhex(body["signature"]), float(body["time"])
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

    def __len__(self) -> int:
        """Hellos remembered now, over all keys."""
        return sum(len(seen) for seen, _ in self._seen.values())

"""Single-use hellos (volunteer/replays.py): a copy refused; memory bounded per key by a floor below
which every hello of that key is refused; other keys unaffected."""

import time

from composer_prime.volunteer.replays import Replays


def hello(node: str, made: float, sig: str) -> dict:
    return {"node_id": node, "time": made, "signature": sig}


def test_a_hello_is_good_once_and_a_full_memory_raises_the_floor():
    r, now = Replays(kept=2), time.time()
    assert r.first_use(hello("a", now, "s1")) and not r.first_use(hello("a", now, "s1"))
    assert r.first_use(hello("b", now, "s1"))  # another key's hello: its own
    assert r.first_use(hello("a", now + 1, "s2")) and r.first_use(hello("a", now + 2, "s3"))  # s1 forgotten: floor = now
    assert not r.first_use(hello("a", now, "s1"))  # forgotten, yet at the floor: refused
    assert not r.first_use(hello("a", now - 5, "s0"))  # below it: refused
    assert r.first_use(hello("a", now + 3, "s4"))

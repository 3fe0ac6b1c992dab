"""Single-use hellos (volunteer/replays.py): a copy refused, re-cased or spaced too (its signature's
bytes are what is remembered); memory bounded per key by a floor below which every hello of that key
is refused; other keys unaffected."""

import time

from composer_prime.volunteer.replays import Replays

A, B = "a" * 64, "b" * 64  # node ids: 64 hex digits


def hello(node: str, made: float, sig: str) -> dict:
    return {"node_id": node, "time": made, "signature": sig}


def sig(n: int) -> str:
    return f"{n:0128x}"  # 128 hex digits, as an ed25519 signature has


def test_a_hello_is_good_once_and_a_full_memory_raises_the_floor():
    r, now = Replays(kept=2), time.time()
    assert r.first_use(hello(A, now, sig(1))) and not r.first_use(hello(A, now, sig(1)))
    assert r.first_use(hello(B, now, sig(1)))  # another key's hello: its own
    assert r.first_use(hello(A, now + 1, sig(2))) and r.first_use(hello(A, now + 2, sig(3)))  # 1 forgotten: floor now
    assert not r.first_use(hello(A, now, sig(1)))  # forgotten, yet at the floor: refused
    assert not r.first_use(hello(A, now - 5, sig(0)))  # below it: refused
    assert r.first_use(hello(A, now + 3, sig(4))) and len(r) == 3  # remembered: A's newest two, B's one


def test_a_copy_re_cased_or_spaced_is_the_same_hello():
    """`bytes.fromhex` reads upper case and spaces: the store keys the bytes, so the same signature (and node id)
    written another way is the same hello. Before: remembered as text, each spelling a first use."""
    r, now, s = Replays(), time.time(), "ab" * 64
    assert r.first_use(hello(A, now, s))
    spaced = " ".join(s[i:i + 2] for i in range(0, len(s), 2))
    assert [r.first_use(hello(A, now, s.upper())), r.first_use(hello(A, now, spaced)),
            r.first_use(hello(A.upper(), now, s))] == [False, False, False]

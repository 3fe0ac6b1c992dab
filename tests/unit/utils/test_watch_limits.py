"""The watchdog's arithmetic (utils/watchdog.py `Watch`) on progress files written by hand: the limit
is max(floor, factor x the slowest process's median step time), `startup_s` before any process has
two marks; a run is stalled only past the limit; the process that advanced longest ago is blamed
(one that never did, first); and where a process is stuck, read from its stacks."""

import json
import time

from composer_prime.utils.watchdog import Watch, place


def mark(where, name: str, t: float) -> None:
    (where / f"{name}.progress").write_text(json.dumps({"what": "step", "value": 0, "time": t}))


def test_the_limit_follows_the_slowest_recent_step_time_with_a_floor(tmp_path):
    w = Watch(tmp_path, factor=5, floor_s=10, startup_s=600, started=time.time() - 60)  # rl began a minute ago
    assert w.limit_s() == 600  # no step yet: the start-up allowance
    now = time.time()
    for i, t in enumerate([now - 40, now - 37, now - 34, now - 31]):  # the trainer: a step every 3 s
        mark(tmp_path, "trainer", t)
        mark(tmp_path, "orchestrator", t - 1.0 + 0.5 * i)  # the orchestrator's: 3.5 s apart
        w.poll()
    assert abs(w.limit_s() - 5 * 3.5) < 1e-6  # the orchestrator's 3.5 s, the slower
    assert 30 < w.silent_s() < 32 and w.stalled()  # last mark 30.5 s ago > 17.5 s
    assert w.blame(["orchestrator", "trainer"]) == "trainer"  # its last mark (now - 31) is older than now - 30.5
    assert w.blame(["inference", "trainer"]) == "inference"  # never advanced at all
    floor = Watch(tmp_path, factor=5, floor_s=100, startup_s=600, started=w.started, marks=w.marks)
    assert floor.limit_s() == 100 and not floor.stalled()  # the floor holds, say, a slow evaluation


def test_where_a_process_is_stuck_prefers_a_ranks_stack_to_its_launchers():
    stacks = {"trainer-11": "trainer.py:70 in main", "trainer-12": "hang_once.py:28 in after_step",
              "orchestrator-13": "orchestrator.py:250 in _loop"}
    assert place("trainer", stacks) == "hang_once.py:28 in after_step"
    assert place("orchestrator", stacks) == "orchestrator.py:250 in _loop"
    assert place("inference", stacks) == "an unknown place (it gave no stacks)"

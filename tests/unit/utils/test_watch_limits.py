"""The watchdog's arithmetic (utils/watch.py `Watch`) on progress files written by hand: the limit of
each phase (`startup_s` until every driving process is up, `first_batch_s` until a step gap is known,
then max(floor, factor x the slowest step so far)); a gap spanning a stall already said is no step;
stalled only past the limit; the process that advanced longest ago is blamed (one that never did,
first); and where a process is stuck, read from its pids' places."""

import json
import time

import pytest

from composer_prime.utils import watch as watch_module
from composer_prime.utils.watch import Watch, place


def mark(where, name: str, **record) -> None:
    (where / f"{name}.progress").write_text(json.dumps({"ready": None, "steps": 0, "step": None, "active": None,
                                                        "gaps": [], "time": None, **record}))


def test_each_phase_has_its_limit_and_the_steady_one_follows_the_slowest_step(tmp_path, monkeypatch):
    now = time.time()
    # the watch's clock held at `now`, so its silences are exact however slowly the host runs this test
    monkeypatch.setattr(watch_module, "time", type("Clock", (), {"time": staticmethod(lambda: now)}))
    w = Watch(tmp_path, factor=5, floor_s=10, startup_s=600, first_batch_s=20, drivers={"trainer", "orchestrator"},
              started=now - 60)  # rl began a minute ago
    mark(tmp_path, "inference", ready=now - 50)  # a server's own marks set no phase
    mark(tmp_path, "trainer", ready=now - 50)
    w.poll()
    assert (w.phase(), w.limit_s()) == ("start", 600)  # the orchestrator is not up yet
    mark(tmp_path, "orchestrator", ready=now - 45, active=now - 40)  # a rollout finished, no step yet
    w.poll()
    assert (w.phase(), w.limit_s()) == ("first", 20) and w.silent_s() == pytest.approx(40) and w.stalled()
    mark(tmp_path, "trainer", ready=now - 50, steps=4, step=now - 31, gaps=[[now - 37, 3.0], [now - 34, 3.0], [now - 31, 3.0]])
    mark(tmp_path, "orchestrator", ready=now - 45, steps=3, step=now - 32, gaps=[[now - 35.5, 3.5], [now - 32, 3.5]])
    w.poll()
    assert w.phase() == "steady" and w.limit_s() == pytest.approx(5 * 3.5)  # the orchestrator's 3.5 s, the slower
    assert w.silent_s() == pytest.approx(31) and w.stalled()  # last mark 31 s ago > 17.5 s
    assert w.blame(["orchestrator", "trainer"]) == "orchestrator"  # its last mark (now - 32) is older than now - 31
    assert w.blame(["inference", "trainer"]) == "inference"  # its last mark (now - 50) older still
    w.hush(now)  # a stall said: silence counts again from now
    assert not w.stalled()
    later = now + 0.01
    mark(tmp_path, "trainer", ready=now - 50, steps=5, step=later, gaps=[[later, 40.0]])  # the gap across it
    w.poll()
    assert w.limit_s() == 5 * 3.5  # no step of 40 s: the stall that was said
    floor = Watch(tmp_path, factor=5, floor_s=100, startup_s=600, drivers={"trainer"}, seen={"trainer": {"steps": 2}},
                  slowest_s=3.5)
    assert floor.limit_s() == 100  # the floor holds, say, a slow evaluation


def test_where_a_process_is_stuck_prefers_a_ranks_stack_to_its_launchers():
    assert place({"trainer-11": "trainer.py:70 in main", "trainer-12": "hang_once.py:28 in after_step"}) \
        == "hang_once.py:28 in after_step"
    assert place({"orchestrator-13": "orchestrator.py:250 in _loop"}) == "orchestrator.py:250 in _loop"
    assert place({}) == "an unknown place (it gave no stacks)"

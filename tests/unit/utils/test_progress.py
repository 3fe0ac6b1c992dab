"""utils/progress.py: the time left to the second, a terminal's one redrawn line against a log's
plain lines (as many as the throttle allows, the last always), and loops of no or unknown length."""

import io
import logging
import re

import pytest

from composer_prime.utils.progress import Progress, StillWaiting, duration, eta_seconds, rate, render, track


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def logged():
    """What the progress logger says at INFO, as lines (the logging set-up's handler, minus its prefix)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("composer_prime.utils.progress")
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lambda: out.getvalue().splitlines()
    logger.removeHandler(handler)
    logger.setLevel(saved)


def counts(lines: list[str]) -> list[tuple[int, int | None]]:
    got = []
    for ln in lines:
        m = re.match(r"\w+: (\d+)(?:/(\d+))? ", ln)
        got.append((int(m[1]), int(m[2]) if m[2] else None))
    return got


def test_eta_is_the_mean_rate_so_far():
    assert eta_seconds(10, 40, 25.0) == 75.0  # 2.5 s per item, 30 items left
    assert eta_seconds(3, 7, 6.0) == 8.0
    assert eta_seconds(40, 40, 99.0) == 0.0
    assert eta_seconds(0, 40, 5.0) is None  # no rate yet
    assert eta_seconds(5, None, 5.0) is None  # no total
    assert eta_seconds(0, 0, 0.0) == 0.0  # nothing to do is done


def test_durations_and_rates_read_at_a_glance():
    assert [duration(s) for s in (0, 42.4, 59.6, 185, 3599, 7620)] == ["0 s", "42 s", "1 min 00 s", "3 min 05 s", "59 min 59 s",
                                                                       "2 h 07 min"]
    assert rate(30, 10.0, "states") == "3.0 states/s"
    assert rate(3, 60.0, "runs") == "3.0 runs/min"
    assert rate(1, 7200.0, "runs") == "0.5 runs/h"
    assert render("replay", 12, 40, "states", 24.0, "3 pairs") == \
        "replay: 12/40 states (30%) | 30.0 states/min | 24 s elapsed, ~56 s left | 3 pairs"
    assert render("replay", 40, 40, "states", 80.0, final=True) == "replay: 40/40 states (100%) | 30.0 states/min | done in 1 min 20 s"


def test_a_log_gets_a_line_per_twentieth_and_ten_seconds_whichever_is_rarer_and_the_last(logged):
    clock = Clock()
    with Progress("replay", 100, "states", stream=io.StringIO(), clock=clock, interval_s=10.0) as p:
        for i in range(100):
            clock.t += 1.0 if i < 50 else 0.1  # slow, then fast
            p.advance()
    got = counts(logged())
    # slow: 10 s pass every 10 states (rarer than every 5); fast: 10 s would take 100 states, so only the last
    assert [d for d, _ in got] == [10, 20, 30, 40, 50, 100] and {t for _, t in got} == {100}
    assert logged()[-1].startswith("replay: 100/100 states (100%) | ") and "done in 55 s" in logged()[-1]


def test_a_loop_stopped_early_still_logs_where_it_stopped(logged):
    clock = Clock()
    with Progress("replay", 40, "states", stream=io.StringIO(), clock=clock, interval_s=0.0) as p:
        for _ in range(7):
            clock.t += 1
            p.advance(note="n")
    assert counts(logged()) == [(2, 40), (4, 40), (6, 40), (7, 40)]  # every 2 (40 / 20), then the last


def test_a_loop_that_raises_leaves_its_error_the_last_line(logged):
    out = io.StringIO()
    with pytest.raises(KeyError):
        with Progress("build", 5, stream=out, live=True, clock=Clock(), width=80) as p:
            p.advance()
            raise KeyError("x")
    assert out.getvalue().endswith("\r\x1b[K")  # the live line cleared, nothing after it
    with pytest.raises(KeyError):
        with Progress("build", 5, stream=io.StringIO(), clock=Clock(), interval_s=10.0) as p:
            p.advance()
            raise KeyError("x")
    assert logged() == []


def test_a_terminal_gets_one_line_redrawn_and_ended(logged):
    clock, out = Clock(), io.StringIO()
    with Progress("build", 3, "sources", stream=out, live=True, clock=clock, width=200) as p:
        for _ in range(3):
            clock.t += 2
            p.advance()
        p.echo("a line of the build's")
    text = out.getvalue()
    assert logged() == []  # nothing through the logs
    assert text.count("\n") == 2 and text.endswith("\n")  # the echoed line and the end of the live one
    frames = [f for f in text.replace("\n", "").split("\r\x1b[K") if f]
    assert frames == ["build: 1/3 sources (33%) | 30.0 sources/min | 2 s elapsed, ~4 s left",
                      "build: 2/3 sources (67%) | 30.0 sources/min | 4 s elapsed, ~2 s left",
                      "build: 3/3 sources (100%) | 30.0 sources/min | 6 s elapsed, ~0 s left",
                      "a line of the build's",
                      "build: 3/3 sources (100%) | 30.0 sources/min | 6 s elapsed, ~0 s left",
                      "build: 3/3 sources (100%) | 30.0 sources/min | done in 6 s"]


def test_a_terminal_line_is_cleared_for_a_log_line_and_cut_to_the_width():
    out, logs = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(logs)  # as the logging set-up's, on the root logger
    logging.getLogger().addHandler(handler)
    try:
        with Progress("x", 10, stream=out, live=True, clock=Clock(), width=12) as p:
            p.advance()
            logging.getLogger("composer_prime.y").warning("a warning")
            assert out.getvalue() == "\r\x1b[Kx: 1/10 ite\r\x1b[K"  # drawn (11 columns), then cleared for the log line
        assert logs.getvalue() == "a warning\n" and handler.filters == []
    finally:
        logging.getLogger().removeHandler(handler)


def test_zero_and_unknown_totals(logged):
    with Progress("redteam", 0, "attacks", stream=io.StringIO(), clock=Clock()):
        pass
    assert logged() == ["redteam: 0/0 attacks (100%) | done in 0 s"]
    clock = Clock()
    for _ in track(iter(range(3)), "scan", "files", stream=io.StringIO(), clock=clock, interval_s=0.0):
        clock.t += 3
    assert counts(logged()[1:]) == [(1, None), (2, None), (3, None), (3, None)]  # every one, then the last
    assert logged()[2] == "scan: 2 files | 20.0 files/min | 6 s elapsed"  # no total: no time left
    assert logged()[-1] == "scan: 3 files | 20.0 files/min | done in 9 s"


def test_still_waiting_says_so_every_period_with_the_time_since_it_began(caplog):
    """A wait says nothing for its first period, then a line per period (not per call), with the seconds since
    it began and the caller's note; a process started alone is never silent longer than that."""
    now = [100.0]
    caplog.set_level(logging.INFO, logger="composer_prime.utils.progress")
    waiting = StillWaiting("weights v4 from the trainer", every_s=30, clock=lambda: now[0])
    said = []
    for t in (110, 129.9, 130, 131, 159, 160.5, 200):
        now[0] = t
        caplog.clear()
        waiting.tick("inference serves v3")
        said += [r.getMessage() for r in caplog.records]
    assert said == ["waiting for weights v4 from the trainer (30s; inference serves v3)",
                    "waiting for weights v4 from the trainer (60s; inference serves v3)",
                    "waiting for weights v4 from the trainer (100s; inference serves v3)"]

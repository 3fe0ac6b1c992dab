"""entrypoints/trainer.py: a trainer node waiting in torchrun's rendezvous for the other nodes says so every
30 s (`StillWaiting`, on a clock moved by hand here) until its ranks start, and the line gets through the
`logging.disable` that mutes torch's own lines while it waits."""

import logging

from composer_prime.entrypoints.trainer import past_disable, until_started
from composer_prime.utils.progress import StillWaiting


def test_a_node_waiting_for_the_others_says_so_every_period_until_its_ranks_start():
    now, said, polls = [0.0], [], [0]

    def started() -> bool:  # each poll 10 s later; the ranks start at the 8th
        polls[0] += 1
        now[0] += 10.0
        return polls[0] > 7

    waiting = StillWaiting("the trainer's 2 nodes to meet at n1:29500", clock=lambda: now[0], say=said.append)
    until_started(started, waiting, poll_s=0.0)
    assert said == ["waiting for the trainer's 2 nodes to meet at n1:29500 (30s)",
                    "waiting for the trainer's 2 nodes to meet at n1:29500 (60s)"]
    assert polls[0] == 8  # and no poll after the ranks started


def test_the_line_gets_through_logging_disable():
    got: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: got.append(record.getMessage())
    root = logging.getLogger()
    root.addHandler(handler)
    logging.disable(logging.CRITICAL)  # what the node's launcher does to torch's own lines
    try:
        logging.getLogger("composer_prime").info("muted")
        past_disable("waiting for the trainer's 2 nodes to meet at n1:29500 (30s)")
    finally:
        logging.disable(logging.NOTSET)
        root.removeHandler(handler)
    assert got == ["waiting for the trainer's 2 nodes to meet at n1:29500 (30s)"]

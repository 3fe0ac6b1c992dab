"""The unit tier's rule holds inside it: starting a process, opening a socket or binding a ZMQ
endpoint beyond inproc:// fails at the call, while an inproc:// pair still works."""

import socket
import subprocess
import sys

import pytest
import zmq

from tests.support.tier_rule import UnitTierViolation


def test_a_process_a_socket_and_a_tcp_endpoint_are_refused():
    with pytest.raises(UnitTierViolation, match="start a process"):
        subprocess.run([sys.executable, "-c", "pass"])
    with socket.socket() as s, pytest.raises(UnitTierViolation, match="connect a socket"):
        s.connect(("127.0.0.1", 9))
    ctx = zmq.Context.instance()
    with ctx.socket(zmq.PAIR) as s, pytest.raises(UnitTierViolation, match="tcp://127.0.0.1:9"):
        s.bind("tcp://127.0.0.1:9")


def test_an_inproc_pair_still_works():
    ctx = zmq.Context.instance()
    with ctx.socket(zmq.PAIR) as a, ctx.socket(zmq.PAIR) as b:
        a.bind("inproc://tier-rule")
        b.connect("inproc://tier-rule")
        a.send(b"x")
        assert b.recv() == b"x"


def test_test_file_basenames_are_unique():
    """Test directories are not packages, so pytest imports each test file by its basename: two files
    of one name anywhere under tests/ or an environment's tests/ stop the whole collection."""
    from collections import Counter

    from tests.conftest import ROOT

    files = [p for d in ("tests", "environments") for p in (ROOT / d).rglob("test_*.py") if "fixtures" not in p.parts]
    assert len(files) > 50
    assert [name for name, n in Counter(p.name for p in files).items() if n > 1] == []

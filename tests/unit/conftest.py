"""The unit tier's rule, enforced: a unit test starts no process, opens no socket (so no server
and no download) and binds no ZMQ endpoint beyond `inproc://`. A test that needs any of these
belongs in tests/integration/; here it fails at the call with `UnitTierViolation`.

The rule is what keeps `pytest tests/unit` fast enough to run while working (docs/testing.md)."""

import os
import socket
import subprocess

import pytest

from tests.support.tier_rule import UnitTierViolation


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise UnitTierViolation(f"a unit test may not {what}: move it to tests/integration/")
    return refuse


def _inproc_only(original, what: str):
    def call(sock, address, *args, **kwargs):
        if not str(address).startswith("inproc://"):
            raise UnitTierViolation(f"a unit test may not {what} {address}: move it to tests/integration/")
        return original(sock, address, *args, **kwargs)
    return call


@pytest.fixture(scope="session", autouse=True)
def _warm_caches():
    # verifiers records its own git commit with every scored rollout, once per process, through a
    # `git rev-parse` subprocess (verifiers.v1.utils.version, cached): run it before the rule holds
    from verifiers.v1.utils.version import verifiers_commit

    verifiers_commit()


@pytest.fixture(autouse=True)
def _no_process_no_socket(monkeypatch, _warm_caches):
    import zmq

    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("start a process"))
    monkeypatch.setattr(os, "fork", _refuse("fork"))
    for name in ("bind", "connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, _refuse(f"{name} a socket"))
    monkeypatch.setattr(zmq.Socket, "bind", _inproc_only(zmq.Socket.bind, "bind"))
    monkeypatch.setattr(zmq.Socket, "connect", _inproc_only(zmq.Socket.connect, "connect to"))

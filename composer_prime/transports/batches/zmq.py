"""Orchestrator ⇄ trainer over one ZMQ DEALER pair: batches one way, the trainer's step the other.

The trainer binds, the orchestrator connects. A connecting DEALER queues messages until the
trainer is up, so nothing is lost to a slow joiner, and the trainer's rank 0 is the only reader
(it scatters micro-batches itself). The way back carries one small message: the step the trainer
expects, with an id fresh at every trainer start. That is how an orchestrator on another machine
learns where a restarted trainer resumed without reading its checkpoints: it regenerates from
there (tasks are a pure function of (seed, step)).

With keys (required beyond loopback, see transports/auth.py) both ends use CURVE: traffic is
encrypted, the trainer accepts only the orchestrator's public key and the orchestrator only
talks to the holder of the trainer's. A sender without the key gets no message through; every
refused handshake and every undecodable message is counted in `BatchReceiver.stats["refused"]`.
"""

from __future__ import annotations

import uuid

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

from composer_prime.contract.batches import Batch, SchemaError, decode, encode

# (public, secret, peer public), z85, from transports.auth.curve_keys; None = no CURVE (loopback only)
CurveKeys = tuple[bytes, bytes, bytes] | None
_REFUSED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH


class BatchSender:
    """The orchestrator's end: sends batches, hears the trainer's announcements."""

    def __init__(self, address: str, keys: CurveKeys = None) -> None:
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 5000)
        if keys is not None:
            self._sock.curve_publickey, self._sock.curve_secretkey, self._sock.curve_serverkey = keys
        self._sock.connect(address)

    def send(self, batch: Batch) -> None:
        self._sock.send(encode(batch))

    def announcements(self) -> list[tuple[str, int]]:
        """(trainer id, expected step) messages received since the last call, oldest first."""
        out = []
        while self._sock.poll(0):
            msg = msgpack.unpackb(self._sock.recv())
            out.append((msg["trainer"], int(msg["expect"])))
        return out

    def close(self) -> None:
        self._sock.close()


class _AllowOne:
    """ZAP credentials: exactly one client public key (the orchestrator's) may connect."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.key


class BatchReceiver:
    """The trainer's end (rank 0): receives batches, announces the step it expects."""

    def __init__(self, address: str, keys: CurveKeys = None) -> None:
        self._ctx = zmq.Context()  # its own: the authenticator below serves every CURVE socket of its context
        # Nothing of the trainer's is worth waiting to deliver once it stops (an announcement to an orchestrator
        # that is gone): with the default infinite linger a trainer stopped by its parent's death hung for ever in
        # the context's term, at garbage collection, still listening on its port (test_rl_vllm's kill -9, CI host)
        self._ctx.setsockopt(zmq.LINGER, 0)
        self._auth = None
        self._sock = self._ctx.socket(zmq.DEALER)
        if keys is not None:
            from zmq.auth.thread import ThreadAuthenticator

            self._auth = ThreadAuthenticator(self._ctx)
            self._auth.start()
            self._auth.configure_curve_callback("*", _AllowOne(keys[2]))
            self._sock.curve_server = True
            self._sock.curve_publickey, self._sock.curve_secretkey = keys[0], keys[1]
        self._monitor = self._sock.get_monitor_socket(_REFUSED)
        self.id = uuid.uuid4().hex  # this trainer start; a new one tells the orchestrator to regenerate
        self.stats = {"received": 0, "refused": 0}
        try:
            self._sock.bind(address)
        except zmq.ZMQError as e:  # the usual cause: another run (or a stale trainer) holds the port
            self.close()
            raise SystemExit(f"transport.address {address}: cannot listen ({e.strerror}); "
                             "is another run using it? pick a free port with --transport.address") from None

    def announce(self, step: int) -> None:
        """Tell the orchestrator which batch comes next; dropped when none is connected (re-sent while waiting)."""
        try:
            self._sock.send(msgpack.packb({"trainer": self.id, "expect": step}), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _count_refused(self) -> None:
        while self._monitor.poll(0):
            recv_monitor_message(self._monitor)
            self.stats["refused"] += 1

    def recv(self, timeout_s: float | None = None) -> Batch | None:
        """The next batch, or None after `timeout_s` seconds without one. A message that is not a
        batch raises SchemaError (and is counted)."""
        ready = self._sock.poll(None if timeout_s is None else int(timeout_s * 1000))
        self._count_refused()
        if not ready:
            return None
        try:
            batch = decode(self._sock.recv())
        except SchemaError:
            self.stats["refused"] += 1
            raise
        self.stats["received"] += 1
        return batch

    def close(self) -> None:
        self._monitor.close(linger=0)
        self._sock.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()

"""Orchestrator → trainer batches over ZMQ PUSH/PULL.

PUSH/PULL rather than PUB/SUB: a PUSH socket queues messages until the trainer connects, so
nothing is lost to a slow joiner, and the trainer's rank 0 is the only reader (it scatters
micro-batches to the other ranks itself).
"""

from __future__ import annotations

import zmq

from composer_prime.transports.batches.schema import Batch, decode, encode


class BatchSender:
    def __init__(self, address: str) -> None:
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, 5000)
        self._sock.connect(address)

    def send(self, batch: Batch) -> None:
        self._sock.send(encode(batch))

    def close(self) -> None:
        self._sock.close()


class BatchReceiver:
    def __init__(self, address: str) -> None:
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PULL)
        try:
            self._sock.bind(address)
        except zmq.ZMQError as e:  # the usual cause: another run (or a stale trainer) holds the port
            self._sock.close(linger=0)
            raise SystemExit(f"transport.address {address}: cannot listen ({e.strerror}); "
                             "is another run using it? pick a free port with --transport.address") from None

    def recv(self, timeout_s: float | None = None) -> Batch | None:
        """The next batch, or None after `timeout_s` seconds without one."""
        if timeout_s is not None and not self._sock.poll(int(timeout_s * 1000)):
            return None
        return decode(self._sock.recv())

    def close(self) -> None:
        self._sock.close(linger=0)

"""Loopback helpers."""

from __future__ import annotations

import random
import socket
from pathlib import Path
from urllib.parse import urlsplit

_handed_out: set[int] = set()
_rng = random.SystemRandom()  # never the global generator: a seeded run would make every process pick alike


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; macOS starts at 49152, so this is below both


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def bind_error(host: str, port: int) -> str | None:
    """Why a TCP server could not listen on host:port now (binding as uvicorn and ZMQ do, with
    SO_REUSEADDR); None if it could."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:  # socket.gaierror too: a host name this machine cannot resolve
        return e.strerror or str(e)
    return None


def free_port() -> int:
    """A port that is free now and stays free until someone binds it on purpose.

    A port the kernel hands out for `bind(0)` comes from the ephemeral range, which is also where every
    outgoing connection takes its source port; between picking and binding, a gloo or HTTP client can grab it
    ("Address already in use" in a CI run). Ports below that range are only ever taken by an explicit bind.
    """
    low = min(_ephemeral_low(), 32768)
    for _ in range(200 if low > 11000 else 0):
        port = _rng.randint(10000, low - 1)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    with socket.socket() as s:  # a crowded low range: fall back to the kernel's pick
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """OSError unless something accepts a TCP connection at host:port (or an http(s) URL's) now."""
    if "://" in address:
        url = urlsplit(address)
        address = f"{url.hostname}:{url.port or (443 if url.scheme == 'https' else 80)}"
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise OSError(f"nothing answers at {address} ({e.strerror or e}); start it first") from None

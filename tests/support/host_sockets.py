"""Which host talks to which service, read from the kernel's TCP tables of network namespaces.

A test that runs each process on its own emulated host (benchmarks/support/netem.py `switched`)
reads `/proc/<pid>/net/tcp` of one process per host (the table of that process's namespace: every
socket on that host) while the run goes on, and asks `judge` what it saw: the cross-host
connections made to each service on the hosts' own addresses, and every breach of "nothing on
loopback between hosts": a service listening on loopback only, a socket that reaches for another
host's service port on a loopback address, a peer that is no host of the run.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import struct
from pathlib import Path

LISTEN, ESTABLISHED = "0A", "01"


@dataclasses.dataclass(frozen=True)
class Sock:
    local: tuple[str, int]
    remote: tuple[str, int]
    state: str  # the kernel's hex state: 0A listening, 01 established, 02 SYN sent, ...


def _addr(field: str) -> tuple[str, int]:
    host, port = field.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = socket.inet_ntoa(struct.pack("<I", int(host, 16)))
    else:  # four little-endian 32-bit words
        ip = str(ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))))
        ip = str(ipaddress.IPv6Address(ip).ipv4_mapped or ip)
    return ip, int(port, 16)


def parse(table: str) -> set[Sock]:
    """The sockets of a /proc/net/tcp or tcp6 text (its header line skipped)."""
    out = set()
    for line in table.splitlines()[1:]:
        f = line.split()
        out.add(Sock(_addr(f[1]), _addr(f[2]), f[3]))
    return out


def read(pid: int) -> set[Sock]:
    """Every TCP socket in the network namespace of process `pid` (empty if it has exited)."""
    out: set[Sock] = set()
    for name in ("tcp", "tcp6"):
        try:
            out |= parse(Path(f"/proc/{pid}/net/{name}").read_text())
        except OSError:
            pass
    return out


def _loopback(ip: str) -> bool:
    return ipaddress.ip_address(ip).is_loopback


def judge(seen: dict[str, set[Sock]], addr: dict[str, str], services: dict[tuple[str, int], str],
          operator: str) -> tuple[set[tuple[str, str]], list[str]]:
    """From each host's sockets (`seen`, by host name; `addr` its address; `services` (host, port) ->
    the service's name; `operator` the test's own address): the (client host, service) pairs
    connected on the hosts' addresses, and every breach, in words."""
    where = {a: h for h, a in addr.items()}
    edges, breaches = set(), []
    for host, socks in seen.items():
        own = {p for (h, p) in services if h == host}
        for s in socks:
            (lip, lport), (rip, rport) = s.local, s.remote
            if s.state == LISTEN:
                if lport in own and _loopback(lip):
                    breaches.append(f"{host}'s {services[host, lport]} listens on {lip}:{lport}, unreachable from other hosts")
                continue
            if _loopback(rip):
                theirs = [n for (h, p), n in services.items() if p == rport and h != host]
                if theirs and rport not in own:
                    breaches.append(f"{host} reaches for {theirs[0]} ({'/'.join(theirs)}'s port) at {rip}:{rport}")
                continue
            if rip == operator and lport not in own:  # the test may call a service, nothing may call the test's host
                breaches.append(f"{host} talks to {rip}:{rport}, the test's own address")
            elif rip not in where and rip != operator:
                breaches.append(f"{host} talks to {rip}:{rport}, no host of this run")
            elif s.state == ESTABLISHED and (where.get(rip), rport) in services:
                edges.add((host, services[where[rip], rport]))
    return edges, breaches

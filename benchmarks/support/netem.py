"""Machines emulated by network namespaces. A slow link between two islands: two namespaces joined
by a veth pair whose both ends shape traffic with `tc netem` (delay and rate), or `tc tbf` (rate
only) where the kernel has no netem (`slow_link`; `linked` is the namespaces and link alone, which
test_volunteers_tls.py uses). Several hosts on one switch (`switched`: a bridge in a namespace of
its own, one cable per host that `Hosts.cut` unplugs and `Hosts.mend` plugs back, and the root
namespace on it too so the test can reach every host), which test_separate_machines.py uses. Each
namespace has its own loopback, so a process that looks for another host's service on 127.0.0.1
finds nothing there. Whoever uses them creates and removes them; traffic stays between them (no
route out). Needs root (or CAP_NET_ADMIN) and the `ip` and `tc` commands; `available()` says why
not where they are missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
from typing import Iterator

PREFIX = "cpdl"  # namespaces and links this module creates are named after it, with the pid


def available() -> str | None:
    """None where a link can be emulated here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    missing = [c for c in ("ip", "tc") if shutil.which(c) is None]
    return f"{' and '.join(missing)} not installed" if missing else None


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def shape(ns: str, dev: str, delay_ms: float, rate_mbit: float) -> str:
    """Shape `dev`'s outgoing traffic: netem's one-way delay and rate (a round trip then takes
    2 x delay_ms), or, in a kernel without sch_netem, tbf's rate alone. Returns what runs."""
    tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root"]
    if subprocess.run([*tc, "netem", "delay", f"{delay_ms}ms", "rate", f"{rate_mbit}mbit"], capture_output=True).returncode == 0:
        return f"netem: {delay_ms:g} ms one way, {rate_mbit:g} Mbit/s"
    sh(*tc, "tbf", "rate", f"{rate_mbit}mbit", "burst", "64kb", "latency", "400ms")
    return f"tbf: {rate_mbit:g} Mbit/s, no added delay (this kernel has no sch_netem)"


def add_namespace(name: str) -> None:
    """A new network namespace with its loopback up (and nothing else)."""
    sh("ip", "netns", "add", name)
    sh("ip", "-n", name, "link", "set", "lo", "up")


@contextlib.contextmanager
def linked() -> Iterator[tuple[list[list[str]], list[str], list[str]]]:
    """Two network namespaces joined by a veth pair, nothing else in them (no route out), removed
    afterwards: per side, the command prefix that runs a process there, its address and its
    interface's name ([prefix_a, prefix_b], [addr_a, addr_b], [dev_a, dev_b])."""
    tag = f"{PREFIX}{os.getpid() % 100000}"
    ns, dev, addr = [f"{tag}a", f"{tag}b"], [f"{tag}va", f"{tag}vb"], ["10.231.0.1", "10.231.0.2"]
    try:
        for n in ns:
            add_namespace(n)
        sh("ip", "link", "add", dev[0], "netns", ns[0], "type", "veth", "peer", "name", dev[1], "netns", ns[1])
        for n, d, a in zip(ns, dev, addr):
            sh("ip", "-n", n, "addr", "add", f"{a}/24", "dev", d)
            sh("ip", "-n", n, "link", "set", d, "up")
        yield [["ip", "netns", "exec", n] for n in ns], addr, dev
    finally:
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


@contextlib.contextmanager
def slow_link(delay_ms: float, rate_mbit: float) -> Iterator[tuple[list[list[str]], list[str], list[str], str]]:
    """`linked`'s namespaces, both ends of the link shaped: yields its three lists and what shapes the link."""
    with linked() as (prefix, addr, dev):
        shaping = ""
        for p, d in zip(prefix, dev):
            shaping = shape(p[-1], d, delay_ms, rate_mbit)
        yield prefix, addr, dev, shaping


@dataclasses.dataclass
class Hosts:
    """`switched`'s hosts: per name, the command prefix that runs a process there and its address;
    `operator` is the root namespace's own address on the switch."""

    prefix: dict[str, list[str]]
    addr: dict[str, str]
    operator: str
    switch: str  # the namespace holding the bridge
    cable: dict[str, str]  # per host, its veth's end on the switch

    def cut(self, host: str) -> None:
        """Unplug `host`'s cable at the switch: its packets and those sent to it are lost from now."""
        sh("ip", "-n", self.switch, "link", "set", self.cable[host], "down")

    def mend(self, host: str) -> None:
        sh("ip", "-n", self.switch, "link", "set", self.cable[host], "up")


@contextlib.contextmanager
def switched(names: list[str]) -> Iterator[Hosts]:
    """One namespace per name, each with one address on a bridge in a namespace of its own (the
    switch), the root namespace on it too at .254; all removed afterwards (deleting the switch's
    namespace removes the bridge and every cable). Subnet 10.232.X.0/24, X from the pid's on, the
    first that no address of the root namespace is in (another run's switch)."""
    tag = f"{PREFIX}{os.getpid() % 100000}"
    taken = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    net = next(n for x in range(250) if f" {(n := f'10.232.{(os.getpid() + x) % 250}')}." not in taken)
    switch, ns = f"{tag}sw", {n: f"{tag}-{n}" for n in names}
    hosts = Hosts({n: ["ip", "netns", "exec", ns[n]] for n in names}, {n: f"{net}.{i + 1}" for i, n in enumerate(names)},
                  f"{net}.254", switch, {n: f"{tag}p{i}" for i, n in enumerate(names)})
    try:
        add_namespace(switch)
        sh("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", switch, "link", "set", "br0", "up")
        ends = [(ns[n], "eth0", hosts.cable[n], hosts.addr[n]) for n in names]
        for host_ns, dev, cable, a in [*ends, (None, f"{tag}op", f"{tag}po", hosts.operator)]:
            if host_ns is not None:
                add_namespace(host_ns)
            where = ["netns", host_ns] if host_ns is not None else []
            sh("ip", "link", "add", dev, *where, "type", "veth", "peer", "name", cable, "netns", switch)
            sh("ip", "-n", switch, "link", "set", cable, "master", "br0", "up")
            on = ["-n", host_ns] if host_ns is not None else []
            sh("ip", *on, "addr", "add", f"{a}/24", "dev", dev)
            sh("ip", *on, "link", "set", dev, "up")
        yield hosts
    finally:
        subprocess.run(["ip", "link", "del", f"{tag}op"], capture_output=True)  # else it lingers while the kernel tidies
        for n in [*ns.values(), switch]:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)

"""A slow link between two islands, emulated: two network namespaces joined by a veth pair whose
both ends shape traffic with `tc netem` (delay and rate), or `tc tbf` (rate only) where the kernel
has no netem (`slow_link`; `linked` is the namespaces and link alone, which test_volunteers_tls.py
uses). Whoever uses them creates and removes them; traffic stays between them (no route out). Needs
root (or CAP_NET_ADMIN) and the `ip` and `tc` commands; `available()` says why not where they are
missing.
"""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def linked() -> Iterator[tuple[list[list[str]], list[str], list[str]]]:
    """Two network namespaces joined by a veth pair, nothing else in them (no route out), removed
    afterwards: per side, the command prefix that runs a process there, its address and its
    interface's name ([prefix_a, prefix_b], [addr_a, addr_b], [dev_a, dev_b])."""
    tag = f"{PREFIX}{os.getpid() % 100000}"
    ns, dev, addr = [f"{tag}a", f"{tag}b"], [f"{tag}va", f"{tag}vb"], ["10.231.0.1", "10.231.0.2"]
    try:
        for n in ns:
            sh("ip", "netns", "add", n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
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

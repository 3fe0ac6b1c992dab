"""What travels between islands, and where torchft listens: the outer gradients' codec, the bytes
and time of every sync, and torchft's endpoints kept on the island's address.

`Wire` stands between torchft's DiLoCo and its Manager (composition: DiLoCo calls the Manager's
methods, `Wire` forwards them). It casts each outer gradient to the wire dtype before the
all-reduce and back after it, counts the payload bytes (numel × the wire dtype's size: what one
island contributes; a ring all-reduce moves 2(n-1)/n of it over each link), and records each sync
from its quorum to its commit. The codec that runs is the one named: float32 and bfloat16 here,
torchft's FP8 quantisation only where torchft can run it (config/diloco.py refuses it elsewhere,
since torchft itself falls back to float32 without a word).

Endpoints: the lighthouse (entrypoints/lighthouse.py) and the island's TCPStore (`store_on`)
bind `host` only. torchft 0.2.0's Manager binds its server to every interface with no way to say
otherwise (manager.py: `bind = f"[::]:{port}"`), so `manager_server_on` hands the Manager, while it
is built, a ManagerServer that binds `host` instead: the one place we change what torchft does.
Healing goes through the process group (torchft's PGTransport), so no HTTP checkpoint server runs.
"""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torchft.manager
from torchft.manager import Manager

WIRE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "quantized": torch.float32}


@dataclass
class Sync:
    """One outer sync as this island saw it."""

    fragment: int
    started: float
    bytes: int = 0
    seconds: float = 0.0
    committed: bool = False
    participants: int = 0


@dataclass
class Wire:
    manager: Manager
    wire_dtype: str
    fragments: int
    syncs: list[Sync] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:  # everything DiLoCo asks of the Manager but what is below
        return getattr(self.manager, name)

    def start_quorum(self, *args: Any, **kwargs: Any) -> None:
        # DiLoCo starts a quorum just before it prepares a fragment: the fragment it syncs is the
        # Manager's step (commits so far) modulo P, the same on every island.
        self.syncs.append(Sync(self.manager.current_step() % self.fragments, time.time()))
        self.manager.start_quorum(*args, **kwargs)

    def allreduce(self, tensor: torch.Tensor, should_quantize: bool = False, **kwargs: Any):
        quantize = self.wire_dtype == "quantized"
        wire = tensor if tensor.dtype == WIRE_DTYPES[self.wire_dtype] else tensor.to(WIRE_DTYPES[self.wire_dtype])
        if self.syncs:
            self.syncs[-1].bytes += wire.numel() * (1 if quantize else wire.element_size())
        work = self.manager.allreduce(wire, should_quantize=quantize, **kwargs)
        if wire is not tensor:  # back into the float32 pseudo-gradient once reduced (run by DiLoCo's wait)
            work.get_future().then(lambda _: tensor.copy_(wire))
        return work

    def should_commit(self, *args: Any, **kwargs: Any) -> bool:
        ok = self.manager.should_commit(*args, **kwargs)
        if self.syncs:
            s = self.syncs[-1]
            s.committed, s.participants, s.seconds = ok, self.manager.num_participants(), time.time() - s.started
        return ok

    def take(self) -> list[Sync]:
        """The syncs finished since the last call."""
        done = [s for s in self.syncs if s.seconds > 0]
        self.syncs = [s for s in self.syncs if s.seconds == 0]
        return done


def store_on(host: str) -> tuple[dist.TCPStore, socket.socket]:
    """A TCPStore master listening on `host` only (torch's own binds every interface), and its
    listening socket: keep it as long as the store."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.bind((host, 0))
    sock.listen()
    port = sock.getsockname()[1]
    store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, master_listen_fd=sock.fileno())
    return store, sock


@contextlib.contextmanager
def manager_server_on(host: str) -> Iterator[None]:
    """While a Manager is built, its server binds `host`:port rather than [::]:port."""
    original = torchft.manager.ManagerServer

    def on_host(*, bind: str, **kwargs: Any):
        return original(bind=f"{host}:{bind.rpartition(':')[2]}", **kwargs)

    torchft.manager.ManagerServer = on_host
    try:
        yield
    finally:
        torchft.manager.ManagerServer = original

"""`[diloco]`: islands synchronised by Streaming DiLoCo on torchft (trainer/diloco.py).

An island is a whole inference + orchestrator + trainer group; its trainer is one torchft replica.
Every `sync_every` (H) inner steps each of the `fragments` (P) parts of the model is synced once,
one fragment every H/P steps: the islands all-reduce the pseudo-gradient Δ = θ_prev − θ_local,
the outer optimizer steps θ_prev with the mean Δ, and the island continues from the result
blended with its local weights by α (0: the synced weights). Communication may overlap τ inner
steps (`delay`). Defaults and their sources:

- outer Nesterov SGD, lr 0.7, momentum 0.9: DiLoCo (Douillard et al. 2023) and INTELLECT-1;
- strided fragments (layer i in fragment i mod P): Streaming DiLoCo (arXiv 2501.18512), which
  found it better than contiguous blocks;
- α 0 and τ 0: torchtitan's fault-tolerance defaults; Streaming DiLoCo reports τ < 5 robust at α 0.5;
- H 8 here rather than INTELLECT-1's 100: an RL run takes hundreds of steps, not tens of
  thousands, and the islands should meet many times in one.

torchft refuses at run time what `_check` refuses here, at load time, with the key to change.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from composer_prime.config.base import FieldError, Port, Strict
from composer_prime.transports.auth import is_loopback
from composer_prime.utils.proc import has_gpu


class DiLoCoConfig(Strict):
    """Islands: one torchft replica per island's trainer, outer-synced by Streaming DiLoCo."""

    islands: int = Field(2, ge=1, description="islands in the run (tasks are split between them); `rl` starts "
                                              "them all on this machine unless `island` is set")
    island: int | None = Field(None, ge=0, description="this machine's island only (0-based), for islands on "
                                                       "separate machines; None: `rl` starts every island here")
    lighthouse: str | None = Field(None, description="host:port of the torchft lighthouse every island reaches; "
                                                     "None: `rl` starts one on 127.0.0.1")
    lighthouse_port: int = Field(29510, ge=1, le=65535, description="the lighthouse `rl` starts (torchft's default port)")
    host: str = Field("127.0.0.1", description="the address this island's torchft servers bind and advertise to "
                                               "the others (the island's fast interface between data centres)")
    trusted_network: bool = Field(False, description="torchft's store, Manager and lighthouse have no authentication: "
                                                     "a host beyond loopback needs this set, saying the network between "
                                                     "the islands is private (a VPC, a VPN)")
    min_islands: int = Field(1, ge=1, description="islands a sync needs to commit (the lighthouse's "
                                                  "min_replicas); fewer and the round is discarded")
    sync_every: int = Field(8, ge=1, description="H: inner steps between two syncs of the same fragment")
    fragments: int = Field(2, ge=1, description="P: parts of the model synced in turn, one every H/P steps")
    layout: Literal["strided", "sequential"] = Field("strided", description="strided: decoder layer i in fragment "
                                                     "i mod P; sequential: contiguous blocks of layers")
    delay: int = Field(0, ge=0, description="τ: inner steps a fragment's all-reduce may overlap before it is "
                                            "waited for")
    alpha: float = Field(0.0, ge=0, le=1, description="α: the island continues from lerp(synced, local, α)")
    outer_lr: float = Field(0.7, gt=0, description="outer SGD learning rate")
    outer_momentum: float = Field(0.9, ge=0, lt=1, description="outer SGD momentum")
    nesterov: bool = Field(True, description="Nesterov momentum for the outer SGD")
    wire_dtype: Literal["float32", "bfloat16", "quantized"] = Field(
        "float32", description="outer gradients on the wire: float32, bfloat16 (half the bytes, summed in float32), "
                               "or torchft's FP8 quantisation (CUDA with Triton only)")
    timeout_s: float = Field(60.0, gt=0, description="a collective or commit waits this long before the round fails")
    quorum_timeout_s: float = Field(600.0, gt=0, description="how long an island waits for the others at a sync")
    heartbeat_timeout_ms: int = Field(5000, ge=100, description="the lighthouse `rl` starts: an island silent this "
                                                                "long leaves the quorum")
    join_timeout_ms: int = Field(2000, ge=0, description="the lighthouse `rl` starts: how long a quorum waits for "
                                                         "stragglers")

    @model_validator(mode="after")
    def _check(self) -> "DiLoCoConfig":
        h, p = self.sync_every, self.fragments
        if p > h:  # the fragments asked for can never each sync in H steps: say so of fragments, not of H
            raise FieldError("fragments", f"{p} is more than sync_every = {h}: every fragment syncs once per "
                                          f"sync_every steps, one every sync_every / fragments steps")
        if h % p:
            raise FieldError("sync_every", f"{h} is not a multiple of fragments = {p}: every fragment syncs once "
                                           f"per {h} steps, one every sync_every / fragments steps")
        if self.delay >= h // p:
            raise FieldError("delay", f"{self.delay} must be below sync_every / fragments = {h // p}: a fragment's "
                                      "all-reduce must finish before the next fragment's starts")
        if self.island is not None and self.island >= self.islands:
            raise FieldError("island", f"{self.island} is not below islands = {self.islands}")
        if self.min_islands > self.islands:
            raise FieldError("min_islands", f"{self.min_islands} is above islands = {self.islands}: no sync "
                                            "could ever commit")
        if self.island is not None and self.lighthouse is None:
            raise FieldError("lighthouse", "is needed with island set: the host:port of the lighthouse every "
                                           "island reaches")
        if self.lighthouse is not None:
            host, sep, port = self.lighthouse.rpartition(":")
            if not (sep and host and port.isdigit() and 1 <= int(port) <= 65535):
                raise FieldError("lighthouse", f"{self.lighthouse!r} is not host:port")
        if not is_loopback(self.host) and not self.trusted_network:
            raise FieldError("host", f"{self.host} is beyond loopback, and torchft's endpoints there would accept anyone: "
                                     "set diloco.trusted_network = true once the islands' network is private")
        if self.wire_dtype == "quantized" and not cuda_with_triton():
            raise FieldError("wire_dtype", "\"quantized\" needs CUDA and Triton (torchft's FP8 kernels); without "
                                           "them torchft would send float32 without a word: use float32 or bfloat16")
        return self

    def lighthouse_address(self) -> str:
        """The lighthouse as torchft's clients want it: http://host:port."""
        return f"http://{self.lighthouse or f'127.0.0.1:{self.lighthouse_port}'}"


class LighthouseConfig(Strict):
    """`uv run lighthouse`: torchft's lighthouse, which forms the islands' quorums. One per run,
    reachable by every island; `rl` starts one itself when it starts every island."""

    host: str = Field("127.0.0.1", description="listening address (the islands' interface between data centres; "
                                               "its RPCs are not authenticated: keep it on a private network)")
    port: Port = Field(29510, description="listening port (torchft's default)")
    min_replicas: int = Field(1, ge=1, description="islands a quorum needs (diloco.min_islands)")
    join_timeout_ms: int = Field(2000, ge=0, description="how long a quorum waits for stragglers")
    heartbeat_timeout_ms: int = Field(5000, ge=100, description="an island silent this long leaves the quorum")
    trusted_network: bool = Field(False, description="its RPCs have no authentication: a host beyond loopback needs "
                                                     "this set, saying the network is private (a VPC, a VPN)")

    @model_validator(mode="after")
    def _check(self) -> "LighthouseConfig":
        if not is_loopback(self.host) and not self.trusted_network:
            raise FieldError("host", f"{self.host} is beyond loopback, and the lighthouse there would accept anyone: "
                                     "set trusted_network = true once the islands' network is private")
        return self

    def binds(self) -> list[tuple[str, str, int]]:
        """(key, host, port) for every port this process listens on."""
        return [("port", self.host, self.port)]

    @classmethod
    def of(cls, d: DiLoCoConfig) -> "LighthouseConfig":
        return cls(port=d.lighthouse_port, min_replicas=d.min_islands, join_timeout_ms=d.join_timeout_ms,
                   heartbeat_timeout_ms=d.heartbeat_timeout_ms)


def cuda_with_triton() -> bool:
    """Whether torchft's quantised all-reduce can run here, without importing torch at config time
    when it cannot (no NVIDIA device node)."""
    import importlib.util

    if not has_gpu() or importlib.util.find_spec("triton") is None:
        return False
    import torch

    return torch.cuda.is_available()

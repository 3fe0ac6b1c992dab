"""An island's trainer as one torchft replica: Streaming DiLoCo between islands (`[diloco]`).

Each island trains on its own batches with its own inner optimizer (AdamW, FSDP2 over its ranks).
Every H/P inner steps one of P fragments of the model is synced with the other islands:

    Δ_i   = θ_prev − θ_i                       the island's pseudo-gradient for the fragment
    Δ     = (1/n) Σ_i Δ_i                      all-reduced over the n islands in the quorum
    θ     = OuterSGD(θ_prev, Δ)                Nesterov, lr 0.7, momentum 0.9 by default
    θ_i  ← lerp(θ, θ_i, α)                     α = 0: every island continues from θ

With plain outer SGD (momentum 0, lr η) that is θ_prev − η·Δ, and with η = 1 the islands' mean.
torchft's `DiLoCo` does this from hooks on the inner optimizer's step, so the trainer loop does not
change: `Island` is the outer-sync hook (trainer/outer_sync.py) that builds it. The quorum needs
`min_islands`; a round without them is discarded (the fragment goes back to θ_prev and syncs again).
An island that starts behind (restarted with --resume, or late) heals from a live peer at its
first quorum: the model, the inner optimizer and each fragment's θ_prev and outer optimizer come
over the process group, and an island behind the others is never the source.

A weight version stays the island's own trainer step: inference serves weights/step_N of its own
island, a sync changes the weights of step N like an optimizer step does, and `max_async_level`
counts island steps as before.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

# torchft's own INFO lines (its Rust side prints every quorum, a structure of hundreds of characters;
# its Python side every commit) drowned the run's step and sync lines: 283 of 614 console lines.
# RUST_LOG=info, set by the user, brings them back. Before torchft's native module is loaded.
os.environ.setdefault("RUST_LOG", "warn")
for _name in ("torchft", "torchft_quorums", "torchft_commits"):
    logging.getLogger(_name).setLevel(logging.WARNING)

from torchft.checkpointing.pg_transport import PGTransport  # noqa: E402
from torchft.local_sgd import DiLoCo  # noqa: E402
from torchft.manager import Manager  # noqa: E402
from torchft.process_group import ProcessGroup, ProcessGroupGloo, ProcessGroupNCCL  # noqa: E402

from composer_prime.config import TrainerConfig  # noqa: E402
from composer_prime.config.diloco import DiLoCoConfig  # noqa: E402
from composer_prime.trainer.diloco_wire import Wire, store_on, manager_server_on  # noqa: E402
from composer_prime.trainer.outer_sync import Stateful  # noqa: E402
from composer_prime.transports.auth import is_loopback  # noqa: E402

log = logging.getLogger(__name__)


def fragments(model: torch.nn.Module, count: int, layout: str) -> list[torch.nn.ModuleList]:
    """The model in `count` fragments of decoder layers: strided (layer i in fragment i mod P) or
    sequential (contiguous blocks). The layers' outside (embeddings, final norm, head: a tied head
    is the embedding itself) rides with fragment 0."""
    layers = list(model.model.layers)
    if count > len(layers):
        raise SystemExit(f"diloco.fragments: {count} is more than the model's {len(layers)} decoder layers")
    if layout == "strided":
        groups = [layers[i::count] for i in range(count)]
    else:
        size, extra = divmod(len(layers), count)
        bounds = [i * size + min(i, extra) for i in range(count + 1)]
        groups = [layers[bounds[i]:bounds[i + 1]] for i in range(count)]
    outside = [m for name, m in model.named_children() if name != "model"]  # the head
    outside += [m for name, m in model.model.named_children() if name != "layers"]  # embeddings, norm, rotary
    return [torch.nn.ModuleList((outside if i == 0 else []) + g) for i, g in enumerate(groups)]


def outer_optimizer(params: Any, d: DiLoCoConfig) -> torch.optim.SGD:
    """Outer SGD over one fragment. Its momentum starts as zeros rather than absent: the first step
    is the same (buf = 0.9·0 + Δ), and a checkpoint taken before any sync has every key to load into."""
    params = list(params)
    sgd = torch.optim.SGD(params, lr=d.outer_lr, momentum=d.outer_momentum, nesterov=d.nesterov and d.outer_momentum > 0)
    if d.outer_momentum > 0:
        for p in params:
            sgd.state[p]["momentum_buffer"] = torch.zeros_like(p)
    return sgd


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class Island:
    """The outer-sync hook for `[diloco]`: one torchft replica per island's trainer."""

    def __init__(self, cfg: TrainerConfig, trainer: Any, pg: ProcessGroup | None = None) -> None:
        """`pg`: the group between islands; by default NCCL where the model is on CUDA, else gloo (a test's
        islands that share one GPU, which NCCL refuses, bring their own)."""
        d: DiLoCoConfig = cfg.diloco
        self.d, self.model, self.inner = d, trainer.model, trainer.optim
        self.heals = 0  # states received from a peer (since the last metrics)
        island = d.island or 0
        rank, world = dist.get_rank(), dist.get_world_size()
        host = socket.gethostbyname(d.host)  # an address: the Manager's server binds host:port, not a name
        if is_loopback(host):  # gloo's own sockets follow the interface named here (torch reads it per group)
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        box = [None]
        if rank == 0:
            self._store, self._store_socket = store_on(host)
            box = [self._store_socket.getsockname()[1]]
        dist.broadcast_object_list(box, src=0)
        # the model's device, not the machine's: islands on a GPU machine's CPU (its tests) all-reduce CPU tensors
        cuda = next(self.model.parameters()).device.type == "cuda"
        timeout = timedelta(seconds=d.timeout_s)
        pg = pg or (ProcessGroupNCCL(timeout=timeout) if cuda else ProcessGroupGloo(timeout=timeout))
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        with manager_server_on(host):
            manager = Manager(
                pg=pg, load_state_dict=self._load, state_dict=self._state, min_replica_size=d.min_islands,
                use_async_quorum=False, timeout=timeout, quorum_timeout=timedelta(seconds=d.quorum_timeout_s),
                connect_timeout=timeout, rank=rank, world_size=world, store_addr=host, store_port=box[0],
                lighthouse_addr=d.lighthouse_address(), replica_id=f"island{island}", hostname=host, port=0,
                checkpoint_transport=PGTransport(pg, timeout=timeout, device=device),
                init_sync=False)  # islands start from the same weights (the model); only one behind the others heals
        self.manager = manager
        self.wire = Wire(manager, d.wire_dtype, d.fragments)
        parts = fragments(self.model, d.fragments, d.layout)
        self.outer = [outer_optimizer(p.parameters(), d) for p in parts]
        self.diloco = DiLoCo(self.wire, parts, self.inner, self.outer, sync_every=d.sync_every,
                             fragment_sync_delay=d.delay, fragment_update_alpha=d.alpha)
        sizes = [sum(p.numel() for p in f.parameters()) for f in parts]
        log.info(f"island {island}: torchft replica on {host}, lighthouse {d.lighthouse_address()}; "
                 f"H={d.sync_every}, P={d.fragments} {d.layout} fragments of {sizes} params, τ={d.delay}, α={d.alpha}; "
                 f"outer gradients on the wire: {self.codec()}")

    def codec(self) -> str:
        """What actually runs: torchft's quantisation only where its kernels are (config/diloco.py)."""
        return {"float32": "float32", "bfloat16": "bfloat16 (cast here, reduced in bfloat16)",
                "quantized": "torchft FP8 (Triton)"}[self.d.wire_dtype]

    # -- the replica's state: what a healing island receives from a peer (torchft's "default" key)
    def _state(self) -> dict[str, Any]:
        return {"model": {n: local(p.data) for n, p in self.model.named_parameters()}, "inner": self.inner.state_dict()}

    def _load(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                local(p.data).copy_(local(state["model"][n]))
        self.inner.load_state_dict(state["inner"])
        self.heals += 1
        log.info(f"healed from a live peer at outer step {self.manager.current_step()}")

    # -- the hook
    def __enter__(self) -> "Island":
        self.diloco.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.diloco.__exit__(*exc)
        self.manager.shutdown(wait=False)

    def state(self) -> dict[str, Stateful]:
        return {"diloco:outer state": _Checkpointed(self)}

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"diloco/outer_step": float(self.manager.current_step())}
        if self.heals:
            out["diloco/heals"], self.heals = float(self.heals), 0
        syncs = self.wire.take()
        for x in syncs:  # the run's console shows each island's syncs under its trainer's name
            log.info(f"outer sync of fragment {x.fragment}: {'committed' if x.committed else 'discarded'} with "
                     f"{x.participants} island(s), {x.bytes / 1e6:.2f} MB in {x.seconds:.2f}s -> outer step "
                     f"{self.manager.current_step()}")
        if syncs:
            last = syncs[-1]
            out |= {"diloco/syncs": float(len(syncs)), "diloco/committed": float(sum(s.committed for s in syncs)),
                    "diloco/fragment": float(last.fragment), "diloco/participants": float(last.participants),
                    "diloco/bytes": float(sum(s.bytes for s in syncs)), "diloco/sync_s": sum(s.seconds for s in syncs)}
        return out


class _Checkpointed:
    """The island's outer state in the trainer's checkpoint: the Manager's step, and per fragment
    θ_prev and the outer optimizer's momentum. Keys carry the rank: each rank holds its own shards."""

    def __init__(self, island: Island) -> None:
        self.island = island

    def state_dict(self) -> dict[str, Any]:
        i = self.island
        backups = [f.original_parameters for f in i.diloco._fragments]  # torchft keeps θ_prev per fragment
        return {f"rank{dist.get_rank()}": {"manager": {k: torch.tensor(v) for k, v in i.manager.state_dict().items()},
                                            "theta_prev": {str(n): b for n, b in enumerate(backups)},
                                            "outer": {str(n): o.state_dict() for n, o in enumerate(i.outer)}}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        i, mine = self.island, state[f"rank{dist.get_rank()}"]
        i.manager.load_state_dict({k: int(v) for k, v in mine["manager"].items()})
        for n, f in enumerate(i.diloco._fragments):
            for name, saved in mine["theta_prev"][str(n)].items():
                f.original_parameters[name].copy_(saved)
        for n, o in enumerate(i.outer):
            o.load_state_dict(mine["outer"][str(n)])

"""The trainer's device mesh, torchtitan's way: named dimensions built once, used by every sharded model.

`dp_replicate × dp_shard` over the ranks of one trainer (one island): FSDP2 shards parameters over
`dp_shard` and, when `dp_replicate` > 1, replicates the shards over `dp_replicate` (HSDP: gradients
all-reduced between replicas, reduce-scattered within one). Replication between islands is not a
mesh dimension: it is torchft's (trainer/diloco.py), whose replicas come and go.
"""

from __future__ import annotations

from typing import NamedTuple

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


class ParallelDims(NamedTuple):
    dp_replicate: int
    dp_shard: int

    @classmethod
    def of_world(cls, dp_replicate: int) -> "ParallelDims":
        """The split of this process group's ranks; `dp_replicate` must divide the world size."""
        world = dist.get_world_size()
        if world % dp_replicate:
            raise SystemExit(f"trainer.dp_replicate: {dp_replicate} does not divide the {world} trainer ranks")
        return cls(dp_replicate, world // dp_replicate)

    def build(self, device: str) -> DeviceMesh:
        """The named mesh over every rank (a collective: every rank calls it, once)."""
        return init_device_mesh(device, tuple(self), mesh_dim_names=("dp_replicate", "dp_shard"))


def dp_mesh(world_mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP2 shards over: `dp_shard` alone when nothing is replicated (plain FSDP), else
    both dimensions (HSDP)."""
    if world_mesh["dp_replicate"].size() == 1:
        return world_mesh["dp_shard"]
    return world_mesh["dp_replicate", "dp_shard"]

"""Model loading and FSDP2 sharding, torchtitan-style: fully_shard each decoder block, then the root."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, PreTrainedModel


def device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(path: str) -> PreTrainedModel:
    dtype = torch.bfloat16 if device_type() == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.config.use_cache = False
    return model


def frozen_copy(path: str) -> PreTrainedModel:
    """The weights at `path`, sharded like the policy and never trained (a reference or a teacher)."""
    return shard(load_model(path)).requires_grad_(False).eval()


def shard(model: PreTrainedModel) -> PreTrainedModel:
    """Shard parameters over all ranks (a one-rank mesh on a single process is valid FSDP2 too)."""
    mesh = init_device_mesh(device_type(), (dist.get_world_size(),))
    for block in model.model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights on rank 0 (other ranks get {}), on CPU."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

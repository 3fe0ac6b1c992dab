"""Model loading and FSDP2 sharding, torchtitan-style: fully_shard each decoder block, then the root.

Mixed precision as the reference trainers do it: the weights are loaded in float32 and stay so
(the master copy AdamW updates, with float32 state), while FSDP2's `MixedPrecisionPolicy` casts
them to the compute dtype for the forward and backward and reduces gradients in float32. Weights
loaded in bfloat16 instead would lose every update below bf16's resolution (2^-7 at 1.0).
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM, PreTrainedModel


def device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def compute_dtype(name: str) -> torch.dtype:
    """A config's `compute_dtype` as a torch dtype; "auto": bfloat16 on CUDA, float32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if device_type() == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def load_model(path: str) -> PreTrainedModel:
    """The weights in float32, whatever the compute dtype: they are the master copy."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config.use_cache = False
    return model


def frozen_copy(path: str, mesh: DeviceMesh, compute: torch.dtype = torch.float32) -> PreTrainedModel:
    """The weights at `path`, sharded like the policy and never trained (a reference or a teacher)."""
    return shard(load_model(path), mesh, compute).requires_grad_(False).eval()


def shard(model: PreTrainedModel, mesh: DeviceMesh, compute: torch.dtype = torch.float32) -> PreTrainedModel:
    """Shard parameters over `mesh` (trainer/parallel.dp_mesh; a one-rank mesh is valid FSDP2 too),
    onto its device; forward and backward run in `compute`, gradients are reduced in float32."""
    mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    for block in model.model.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights on rank 0 (other ranks get {}), on CPU."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

"""Trainer checkpoints: model + optimizer (+ the EMA teacher, when there is one) + progress,
sharded with torch.distributed.checkpoint.

`checkpoints/step_N/` holds the state after N completed steps; DONE is written last, so an
interrupted save is ignored on resume and the previous checkpoint is used.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_model_state_dict, set_state_dict

DONE = "DONE"


def latest(root: Path) -> tuple[int, Path] | None:
    done = [(int(p.name.split("_")[1]), p) for p in root.glob("step_*") if (p / DONE).exists()]
    return max(done) if done else None


def _state(model: torch.nn.Module, optim: torch.optim.Optimizer, teacher: torch.nn.Module | None) -> dict:
    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd} | ({"teacher": get_model_state_dict(teacher)} if teacher is not None else {})


def save(root: Path, step: int, model: torch.nn.Module, optim: torch.optim.Optimizer, keep_last: int,
         teacher: torch.nn.Module | None = None) -> None:
    out = root / f"step_{step}"
    if dist.get_rank() == 0:
        shutil.rmtree(out, ignore_errors=True)
    dist.barrier()
    dcp.save(_state(model, optim, teacher), checkpoint_id=str(out))
    dist.barrier()
    if dist.get_rank() == 0:
        (out / DONE).write_text(json.dumps({"step": step}))
        finished = sorted(int(p.name.split("_")[1]) for p in root.glob("step_*") if (p / DONE).exists())
        for old in finished[:-keep_last]:
            shutil.rmtree(root / f"step_{old}", ignore_errors=True)
    dist.barrier()


def load(path: Path, model: torch.nn.Module, optim: torch.optim.Optimizer, teacher: torch.nn.Module | None = None) -> None:
    if teacher is not None and not any(k.startswith("teacher.") for k in dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata):
        raise SystemExit(f"{path} holds no EMA teacher: the run was started with another trainer.loss.distill.teacher")
    state = _state(model, optim, teacher)
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if teacher is not None:
        set_model_state_dict(teacher, state["teacher"])

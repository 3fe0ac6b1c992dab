"""Trainer checkpoints: model + optimizer + whatever the loss channels declare (an EMA teacher) and
the outer-sync hook keeps (an island's outer state) + progress, sharded with torch.distributed.checkpoint.

`checkpoints/step_N/` holds the state after N completed steps; DONE is written last, so an
interrupted save is ignored on resume and the previous checkpoint is used. DONE names the step and
the run that wrote it (utils/run_dir.py): a run resumes only its own checkpoints, and pruning keeps
the newest of the current run, never an older run's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Union

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_model_state_dict, set_state_dict

from composer_prime.trainer.outer_sync import Stateful
from composer_prime.utils import steps
from composer_prime.utils.run_dir import DONE

Saved = Union[torch.nn.Module, Stateful]  # what a checkpoint holds beside the model and optimizer


def latest(root: Path, run: str | None = None) -> tuple[int, Path] | None:
    """The newest complete checkpoint, of run `run` when it is given (or from before run ids)."""
    return steps.latest(root, DONE, run)


def resumable(root: Path, run: str | None) -> tuple[int, Path, str | None] | None:
    """(step, path, run id) of the checkpoint a trainer told to resume continues from: the newest of run
    `run` (any run's when None); None when there is none at all. A directory whose checkpoints are all
    another run's is refused in one line: resuming it would continue that run under this one's name."""
    if (found := latest(root, run)) is not None:
        return found[0], found[1], steps.run_of(found[1], DONE) or run
    if run is not None and (other := latest(root)) is not None:
        raise SystemExit(f"{root}: no checkpoint of run {run} to resume; the newest, {other[1].name}, is run "
                         f"{steps.run_of(other[1], DONE)}'s (start over without resume, in another output_dir)")
    return None


def _key(label: str) -> str:
    """A module's key in the checkpoint: its label with no dot (DCP flattens keys on dots)."""
    return label.replace(".", "_").replace(" ", "_")


def _state(model: torch.nn.Module, optim: torch.optim.Optimizer, extra: dict[str, Saved]) -> dict:
    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd} | {_key(k): _of(m) for k, m in extra.items()}


def _of(saved: Saved) -> dict:
    return get_model_state_dict(saved) if isinstance(saved, torch.nn.Module) else saved.state_dict()


def save(root: Path, step: int, model: torch.nn.Module, optim: torch.optim.Optimizer, keep_last: int,
         extra: dict[str, Saved] | None = None, run: str | None = None) -> None:
    """`extra`: modules (their model state dict) or other state (its `state_dict()`) by label
    ("distill:EMA teacher", "diloco:outer state"), saved beside the model. `run`: the run id DONE names;
    pruning then keeps the newest `keep_last` of that run and deletes other runs' checkpoints."""
    out = steps.step_path(root, step)
    if dist.get_rank() == 0:
        shutil.rmtree(out, ignore_errors=True)
    dist.barrier()
    dcp.save(_state(model, optim, extra or {}), checkpoint_id=str(out))
    dist.barrier()
    if dist.get_rank() == 0:
        (out / DONE).write_text(json.dumps({"step": step, "run": run}))
        steps.prune(root, keep_last, DONE, run=run)
    dist.barrier()


def load(path: Path, model: torch.nn.Module, optim: torch.optim.Optimizer,
         extra: dict[str, Saved] | None = None) -> None:
    extra = extra or {}
    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    for label in extra:
        if not any(k.startswith(_key(label) + ".") for k in saved):
            channel, _, what = label.partition(":")
            raise SystemExit(f"{path} holds no {what or label}: the run was started with another trainer.loss.{channel} configuration")
    state = _state(model, optim, extra)
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for label, saved in extra.items():
        if isinstance(saved, torch.nn.Module):
            set_model_state_dict(saved, state[_key(label)])
        else:
            saved.load_state_dict(state[_key(label)])

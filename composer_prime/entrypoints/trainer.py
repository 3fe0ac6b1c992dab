"""`uv run trainer @ trainer.toml`: validates the config, then runs the trainer under torchrun."""

from __future__ import annotations

import os
import sys

from composer_prime.config import TrainerConfig, load_or_exit
from composer_prime.utils.net import free_port


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cfg, dry_run = load_or_exit(TrainerConfig, argv)
    if dry_run:
        return
    if "LOCAL_RANK" in os.environ:  # already under torchrun
        from composer_prime.trainer.train import main as train

        return train(argv)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={cfg.nproc}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", "composer_prime.trainer.train", *argv]
    os.execv(sys.executable, cmd)  # torchrun takes our pid, so signals reach it and its ranks directly


if __name__ == "__main__":
    main()

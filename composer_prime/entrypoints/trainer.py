"""`uv run trainer @ trainer.toml`: validates the config, then runs the trainer under torchrun."""

from __future__ import annotations

import os
import sys

from composer_prime.config import TrainerConfig, load_or_exit
from composer_prime.transports import auth
from composer_prime.utils.net import free_port


def check_keys(cfg: TrainerConfig) -> None:
    """Refuse to start unprotected or without a key it will need: here, in one line, rather than from
    inside torchrun (whose report of a failed rank is many lines)."""
    keys = cfg.auth.keys_dir
    auth.require("transport.address", auth.zmq_host(cfg.transport.address), keys is not None, "push training batches")
    if keys is not None:
        auth.curve_keys(keys, "trainer", "orchestrator")
        auth.token(keys)
    if cfg.weight_broadcast.type == "shardcast" and not cfg.signing_key().exists():
        auth.refuse(f"weight_broadcast.key_path {cfg.signing_key()}: no signing key; {auth.HOW}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cfg, dry_run = load_or_exit(TrainerConfig, argv)
    if dry_run:
        return
    check_keys(cfg)
    if "LOCAL_RANK" in os.environ:  # already under torchrun
        from composer_prime.trainer.train import main as train

        return train(argv)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={cfg.nproc}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", "composer_prime.trainer.train", *argv]
    os.execv(sys.executable, cmd)  # torchrun takes our pid, so signals reach it and its ranks directly


if __name__ == "__main__":
    main()

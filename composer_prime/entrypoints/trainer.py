"""`uv run trainer @ trainer.toml`: validates the config, then runs the trainer: one rank in this
very process, several under torchrun.

One rank needs no launcher: this process joins a process group of one over an in-memory
store (trainer/train.py's `join`, as `sft` does; FSDP2 and the all-reduces run as with more),
which saves a process, its imports, a port and a rendezvous at every start. For several,
torchrun runs in this process, so signals reach it directly, and starts this same module in
each rank (`rank_main`, told apart by torchrun's LOCAL_RANK). Its own reports
stay off the console: a rank that fails prints its own error line, and torchrun's failure table
and SignalException traceback (when `rl` stops the trainer) would only bury that line.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from composer_prime.config import TrainerConfig, load_or_exit
from composer_prime.entrypoints import checks
from composer_prime.transports import auth
from composer_prime.utils.logs import setup
from composer_prime.utils.net import free_port
from composer_prime.utils.proc import exit_with_parent, pin_cpus, run_main


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


def rank_main(argv: list[str]) -> None:
    """One rank, under torchrun (ours, or one started by hand: then the launcher owns the checks)."""
    exit_with_parent()  # a rank dies with torchrun, also when torchrun is SIGKILLed
    argv = argv[1:] if argv[:1] == ["--"] else argv  # the launcher's separator, where argparse kept it
    setup("trainer", quiet=os.environ.get("RANK", "0") != "0")
    cfg, _ = load_or_exit(TrainerConfig, argv)
    train(cfg)


def train(cfg: TrainerConfig) -> None:
    pin_cpus(cfg.cpus, "trainer")
    from composer_prime.trainer.train import run

    run(cfg)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "LOCAL_RANK" in os.environ:
        return rank_main(argv)
    cfg, dry_run = load_or_exit(TrainerConfig, argv, checks.PROCESS, ports=True)
    if dry_run:
        return
    check_keys(cfg)
    if cfg.nproc == 1:
        setup("trainer")
        # stopped (rl, Ctrl-C): the exit code torchrun gives, without a traceback from wherever training was
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
        return train(cfg)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    logging.disable(logging.ERROR)  # this process only launches ranks; torch's elastic loggers set their own levels
    try:
        torchrun([f"--nproc-per-node={cfg.nproc}", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
                  # "--": our flags are the ranks', never torchrun's (it read `--nproc` as its own, ambiguously)
                  "-m", "composer_prime.entrypoints.trainer", "--", *argv])
    except SignalException as e:  # stopped (rl, Ctrl-C): torchrun has stopped the ranks; nothing to report
        raise SystemExit(128 + int(e.sigval)) from None
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        if failure.exitcode < 0:  # killed by a signal: the rank could print nothing itself
            logging.disable(logging.NOTSET)  # torchrun is done: this one line of ours must get through
            setup("trainer", stderr=True)  # stderr, as a failed command's last line (utils/logs.py)
            logging.getLogger(__name__).error(f"rank {rank} died of {failure.signal_name()}")
            raise SystemExit(128 - failure.exitcode) from None
        raise SystemExit(failure.exitcode) from None


if __name__ == "__main__":
    run_main(main)

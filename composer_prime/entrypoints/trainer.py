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
import threading
import time
from typing import Callable, NoReturn

from composer_prime.config import TrainerConfig, load_or_exit
from composer_prime.entrypoints import checks
from composer_prime.transports import auth
from composer_prime.utils.logs import setup
from composer_prime.utils.net import check_reachable, free_port
from composer_prime.utils.proc import exit_with_parent, pin_cpus, run_main
from composer_prime.utils.progress import StillWaiting


# what `rl` imports once for all the processes it forks (utils/prefork.py): the modules main() imports
PRELOAD = ("composer_prime.trainer.train",)

def check_keys(cfg: TrainerConfig) -> None:
    """Refuse to start unprotected or without a key it will need: here, in one line, rather than from
    inside torchrun (whose report of a failed rank is many lines). Only node 0 receives and publishes."""
    if cfg.nodes.rank > 0:
        return
    keys = cfg.auth.keys_dir
    auth.require("transport.address", auth.zmq_host(cfg.transport.address), keys is not None, "push training batches")
    if keys is not None:
        auth.curve_keys(keys, "trainer", "orchestrator")
        auth.token(keys)
    if cfg.weight_broadcast.type == "shardcast" and not cfg.signing_key().exists():
        auth.refuse(f"weight_broadcast.key_path {cfg.signing_key()}: no signing key; {auth.HOW}")


def interface_of(address: str) -> str:
    """The name of this machine's network interface holding `address` (one line and exit 2 if none does)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addrs):
            return name
    stop(f"trainer.nodes.host: no network interface of this machine has the address {address}")


def stop(line: str) -> NoReturn:
    """The one line a failed start ends with, and exit code 2."""
    logging.disable(logging.NOTSET)
    print(f"error: {line}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def wait_for_master(master: str, timeout_s: float) -> None:
    """Until node 0's rendezvous answers (it starts when node 0's `trainer` does), saying so every 30 s."""
    waiting, deadline = StillWaiting(f"node 0 of the trainer at {master}"), time.monotonic() + timeout_s
    while True:
        try:
            return check_reachable(master, 2.0)
        except OSError as e:
            if time.monotonic() > deadline:
                stop(f"trainer.nodes.master: {e} (waited {timeout_s:.0f}s)")
            waiting.tick()
            time.sleep(1.0)


def past_disable(line: str) -> None:
    """An info line written to the root logger's handlers past logging.disable, which mutes torch's own lines."""
    record = logging.LogRecord(__name__, logging.INFO, __file__, 0, line, None, None)
    for handler in logging.getLogger().handlers:
        handler.handle(record)


def until_started(started: Callable[[], bool], waiting: StillWaiting, poll_s: float = 0.5) -> None:
    """Poll `started` every `poll_s` seconds, `waiting` saying every period that it goes on."""
    while not started():
        time.sleep(poll_s)
        waiting.tick()


def say_while_nodes_join(count: int, master: str) -> None:
    """torchrun's rendezvous waits for every node without a word: say so every 30 s until this node's ranks
    start (torchrun's children), past logging.disable."""
    import psutil

    me = psutil.Process()
    waiting = StillWaiting(f"the trainer's {count} nodes to meet at {master}", say=past_disable)
    threading.Thread(target=until_started, args=(lambda: bool(me.children()), waiting), daemon=True,
                     name="nodes-join").start()


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
    if cfg.world_size() == 1:
        setup("trainer")
        # stopped (rl, Ctrl-C): the exit code torchrun gives, without a traceback from wherever training was
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
        return train(cfg)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed import DistError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import main as torchrun

    nodes = cfg.nodes
    master = nodes.address() if nodes.count > 1 else ("127.0.0.1", free_port())
    if nodes.host is not None:  # gloo and NCCL pick the interface holding this node's address, not the host name's
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(var, interface_of(nodes.host))
    setup("trainer")
    if nodes.count > 1:
        if nodes.rank > 0:  # before torchrun, whose client logs each failed try from C++, many lines a try
            wait_for_master(f"{master[0]}:{master[1]}", nodes.join_timeout_s)
        say_while_nodes_join(nodes.count, f"{master[0]}:{master[1]}")
    logging.disable(logging.ERROR)  # this process only launches ranks; torch's elastic loggers set their own levels
    try:
        torchrun([f"--nnodes={nodes.count}", f"--node-rank={nodes.rank}", f"--nproc-per-node={cfg.nproc}",
                  f"--master-addr={master[0]}", f"--master-port={master[1]}", f"--rdzv-conf=timeout={nodes.join_timeout_s}",
                  # "--": our flags are the ranks', never torchrun's (it read `--nproc` as its own, ambiguously)
                  "-m", "composer_prime.entrypoints.trainer", "--", *argv])
    except (RendezvousError, DistError) as e:  # a node that never came, or a master that went away
        stop(f"trainer.nodes: the {nodes.count} nodes did not meet at {master[0]}:{master[1]} within "
             f"{nodes.join_timeout_s}s ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
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

"""`uv run lighthouse [--host 127.0.0.1] [--port 29510] [--min_replicas 1]`: torchft's lighthouse for
DiLoCo islands (config/diloco.py), in this process until it is stopped."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from composer_prime.config import load_or_exit
from composer_prime.config.diloco import LighthouseConfig
from composer_prime.utils.logs import setup


def main(argv: list[str] | None = None) -> None:
    setup("lighthouse")
    cfg, dry_run = load_or_exit(LighthouseConfig, sys.argv[1:] if argv is None else argv, {}, ports=True)
    if dry_run:
        return
    os.environ.setdefault("RUST_LOG", "warn")  # its INFO line per quorum drowns a run's console (trainer/diloco.py)
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(bind=f"{cfg.host}:{cfg.port}", min_replicas=cfg.min_replicas,
                              join_timeout_ms=cfg.join_timeout_ms, heartbeat_timeout_ms=cfg.heartbeat_timeout_ms)
    logging.getLogger(__name__).info(f"lighthouse on {cfg.host}:{cfg.port}, quorums of at least {cfg.min_replicas}")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()


if __name__ == "__main__":
    main()

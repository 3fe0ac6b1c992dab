"""`uv run worker --join URL --token T`: lend this machine to a run as a volunteer inference node
(volunteer/worker.py). Needs TOPLOC: `uv run composer-prime toploc install`."""

from __future__ import annotations

import asyncio
import logging
import sys

from composer_prime.config import load_or_exit
from composer_prime.config.volunteers import WorkerConfig
from composer_prime.entrypoints import checks
from composer_prime.transports.auth import refuse
from composer_prime.utils.logs import setup


def main(argv: list[str] | None = None) -> None:
    setup("worker")
    cfg, dry_run = load_or_exit(WorkerConfig, sys.argv[1:] if argv is None else argv, checks.WORKER)
    if dry_run:
        return
    from composer_prime.verify.toploc import ProofError
    from composer_prime.volunteer.keys import load_or_make
    from composer_prime.volunteer.worker import Ejected, Worker

    try:
        key = load_or_make(cfg.key_path)
        sent = asyncio.run(Worker(cfg, key).run())
    except (ProofError, Ejected, ValueError, OSError) as e:
        refuse(str(e))
    logging.getLogger(__name__).info(f"{sent} submissions sent")


if __name__ == "__main__":
    main()

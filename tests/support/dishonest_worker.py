"""`python -m tests.support.dishonest_worker CLASS <worker flags>`: a red-team worker (one of
tests/support/volunteers.py's classes) as its own process, joined to a real run like `uv run worker`."""

import asyncio
import sys

from composer_prime.config import load_or_exit
from composer_prime.config.volunteers import WorkerConfig
from composer_prime.utils.logs import setup
from composer_prime.volunteer.keys import load_or_make
from composer_prime.volunteer.worker import Ejected
from tests.support import volunteers

if __name__ == "__main__":
    setup("worker")
    cls = getattr(volunteers, sys.argv[1])
    cfg, _ = load_or_exit(WorkerConfig, sys.argv[2:])
    try:
        asyncio.run(cls(cfg, load_or_make(cfg.key_path)).run())
    except Ejected as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None

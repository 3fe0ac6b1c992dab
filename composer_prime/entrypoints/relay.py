"""`uv run relay --upstream URL[,URL] --public_key HEX [--port 8200] [--data_dir DIR]`: a SHARDCAST relay."""

from __future__ import annotations

import asyncio
import logging
import sys

from composer_prime.config import RelayConfig, load_or_exit
from composer_prime.contract.weights import Shardcast
from composer_prime.entrypoints import checks
from composer_prime.transports.auth import public_key
from composer_prime.utils.logs import setup


def main(argv: list[str] | None = None) -> None:
    setup("relay")
    cfg, dry_run = load_or_exit(RelayConfig, sys.argv[1:] if argv is None else argv, checks.RELAY, ports=True)
    if dry_run:
        return
    from composer_prime.transports.weights.shardcast.relay import Relay, serve

    relay = Relay(Shardcast(tuple(cfg.upstream), public_key(cfg.public_key)), cfg.data_dir, cfg.keep_last, cfg.poll_wait_s)
    logging.getLogger(__name__).info(f"mirroring {', '.join(cfg.upstream)} on http://{cfg.host}:{cfg.port} ({cfg.data_dir})")
    asyncio.run(serve(relay, cfg.host, cfg.port))


if __name__ == "__main__":
    main()

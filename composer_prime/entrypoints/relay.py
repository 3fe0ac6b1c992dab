"""`uv run relay --upstream URL[,URL] --public_key HEX [--port 8200] [--data_dir DIR]`: a SHARDCAST relay."""

from __future__ import annotations

import asyncio
import sys

from composer_prime.config import RelayConfig, load_or_exit
from composer_prime.entrypoints import checks
from composer_prime.transports.auth import public_key


def main(argv: list[str] | None = None) -> None:
    cfg, dry_run = load_or_exit(RelayConfig, sys.argv[1:] if argv is None else argv, checks.RELAY, ports=True)
    if dry_run:
        return
    from composer_prime.transports.weights.shardcast.relay import Relay, serve

    log = lambda m: print(m, flush=True)  # noqa: E731
    relay = Relay(cfg.upstream, cfg.data_dir, public_key(cfg.public_key), cfg.keep_last, cfg.poll_wait_s, log=log)
    log(f"[relay] mirroring {', '.join(cfg.upstream)} on http://{cfg.host}:{cfg.port} ({cfg.data_dir})")
    asyncio.run(serve(relay, cfg.host, cfg.port))


if __name__ == "__main__":
    main()

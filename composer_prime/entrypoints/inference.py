"""`uv run inference @ inference.toml`: the generation server.

The config, the model, the directories and the ports are checked before the engine (and torch)
is imported, so a mistake is one line within a second.
"""

from __future__ import annotations

import asyncio
import sys

from composer_prime.config import InferenceConfig, load_or_exit
from composer_prime.entrypoints import checks
from composer_prime.transports import auth
from composer_prime.utils.logs import setup
from composer_prime.utils.proc import pin_cpus


# what `rl` imports once for all the processes it forks (utils/prefork.py): the modules main() imports
PRELOAD = ("composer_prime.inference.serve",)

def main(argv: list[str] | None = None) -> None:
    setup("inference")
    cfg, dry_run = load_or_exit(InferenceConfig, sys.argv[1:] if argv is None else argv, checks.INFERENCE, ports=True)
    if dry_run:
        return
    token = auth.token(cfg.auth.keys_dir)
    auth.require("inference.host", cfg.host, token is not None, "load any weights through /update_weights")
    if cfg.weight_broadcast.type == "shardcast":
        auth.public_key(cfg.weight_broadcast.public_key)  # a missing key file is refused now, not once serving
    pin_cpus(cfg.cpus, "inference")
    from composer_prime.inference.serve import serve

    asyncio.run(serve(cfg, token))


if __name__ == "__main__":
    main()

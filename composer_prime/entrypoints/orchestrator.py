"""`uv run orchestrator @ orchestrator.toml`: sample, score and send batches to the trainer.

The config, the model and the output directory are checked before transformers and the
environments are imported, so a mistake is one line within a second.
"""

from __future__ import annotations

import asyncio
import sys

from composer_prime.config import OrchestratorConfig, load_or_exit
from composer_prime.entrypoints import checks
from composer_prime.transports import auth
from composer_prime.utils.logs import setup
from composer_prime.utils.proc import pin_cpus, run_main


# what `rl` imports once for all the processes it forks (utils/prefork.py): the modules main() imports
PRELOAD = ("composer_prime.orchestrator.orchestrator",)

def main(argv: list[str] | None = None) -> None:
    setup("orchestrator")
    cfg, dry_run = load_or_exit(OrchestratorConfig, sys.argv[1:] if argv is None else argv, checks.ORCHESTRATOR, ports=True)
    if dry_run:
        return
    # the volunteer pool beyond loopback: joins need a token and it serves TLS only (config/volunteers.py)
    keys = None
    if cfg.auth.keys_dir is not None:
        keys = auth.curve_keys(cfg.auth.keys_dir, "orchestrator", "trainer")
    elif not auth.is_loopback(host := auth.zmq_host(cfg.transport.address)):
        auth.refuse(f"transport.address = {host} is beyond loopback, where batches travel only encrypted (CURVE); {auth.HOW}")
    pin_cpus(cfg.cpus, "orchestrator")
    from composer_prime.env_runtime.envs import CHEAP, check_envs
    from composer_prime.env_runtime.errors import EnvError

    try:  # a package missing, a server not answering: one line before transformers and verifiers load
        check_envs(cfg, CHEAP)
    except EnvError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    from composer_prime.orchestrator.client import InferenceUnreachable
    from composer_prime.orchestrator.orchestrator import Orchestrator

    # An environment missing, misconfigured or failing in its own code, or inference gone: one line,
    # no traceback (batches sent so far are the trainer's; `rl --resume` continues the run).
    try:
        orchestrator = Orchestrator(cfg, keys)
        asyncio.run(orchestrator.run_loop())
    except (EnvError, InferenceUnreachable) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    run_main(main)

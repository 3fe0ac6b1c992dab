"""Helpers shared by integration tests: `composer-prime env serve` as a real server process; the
session's shared runs (tests/support/shared_runs.py) as fixtures."""

import subprocess
import sys

import httpx

from tests.conftest import free_port, start_until_ready
from tests.support.shared_runs import (relay_run, tool_calc_distill_run,  # noqa: F401 - read by several files
                                      tool_calc_warm_start, wheelhouse)

ENV_SERVE = [sys.executable, "-m", "composer_prime.entrypoints.cli", "env", "serve"]


def serve_env(env: str, *extra: str) -> tuple[subprocess.Popen, str]:
    """`composer-prime env serve ENV *extra` on a free loopback port, once its /health answers: (process, URL)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_until_ready([*ENV_SERVE, env, *extra, "--port", str(port)],
                             lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200, timeout_s=180)
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)

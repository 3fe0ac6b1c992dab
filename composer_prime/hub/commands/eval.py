"""`composer-prime env eval ENV --url URL --model M -n N`: run N tasks against a running
OpenAI-compatible inference server, print the mean reward, write one JSONL row per task."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

from composer_prime.hub.errors import ToolError, one_line_errors


@one_line_errors
def run(args: argparse.Namespace) -> int:
    from composer_prime.env_runtime.calls import CallBox, code_of
    from composer_prime.hub.evaluate import evaluate, write_rows
    from composer_prime.hub.loading import load_env, taskset_args

    if args.num_tasks < 1:
        raise ToolError("-n must be at least 1")
    if args.call_timeout <= 0:
        raise ToolError("--call-timeout must be more than 0 seconds")
    env, tasks = load_env(args.env, taskset_args(args.args), args.num_tasks)
    box = CallBox(env, args.call_timeout, code_of(tasks))
    key = os.environ.get(args.api_key_var) if args.api_key_var else None
    start = time.monotonic()
    rows = asyncio.run(evaluate(tasks, args.url, args.model, args.max_tokens, args.temperature, args.seed,
                                args.concurrency, key, args.max_turns, box=box))
    name = env.rsplit("/", 1)[-1].split("@")[0]
    out = Path(args.out or f"outputs/eval/{name}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    write_rows(rows, out)
    mean = sum(r["reward"] for r in rows) / len(rows)
    print(f"{env}: mean reward {mean:.4f} over {len(rows)} tasks ({time.monotonic() - start:.1f}s); rows in {out}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("eval", help="evaluate an environment against a running inference server")
    p.add_argument("env", help="installed environment id or package directory")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000 (speaks /v1/chat/completions)")
    p.add_argument("--model", required=True, help="model name sent with each request")
    p.add_argument("-n", "--num-tasks", type=int, default=20, help="tasks to evaluate (default 20)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per model turn (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--seed", type=int, default=0, help="request i is sent with seed+i")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (default 8)")
    p.add_argument("--max-turns", type=int, default=8, help="turn limit for tasks with tools (default 8)")
    p.add_argument("--args", help="taskset config as JSON")
    p.add_argument("--call-timeout", type=float, default=60.0, metavar="S",
                   help="seconds a scoring call may take before it is called hung (default 60)")
    p.add_argument("--api-key-var", help="name of an environment variable holding the server's API key")
    p.add_argument("--out", help="results JSONL (default outputs/eval/<env>-<time>.jsonl)")
    p.set_defaults(func=run)
    return p

"""One evaluator for every system of a race: each kept checkpoint, loaded in turn into our inference
server (embedded engine, outside any timed run), scored on the same held-out tasks and seeds."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from composer_prime.utils.net import free_port
from composer_prime.utils.proc import die_with_parent

EVAL_SEEDS = (10_000_000, 20_000_000)  # two samples per held-out task, the same for every checkpoint


async def heldout_rewards(url: str, paths: list[str | None], n_tasks: int, max_tokens: int) -> list[float]:
    """Held-out reward of each checkpoint (None: the starting model), loaded into one server in turn."""
    from composer_prime.hub.evaluate import evaluate
    from composer_prime.env_runtime.tasksets import load_tasks

    tasks = load_tasks("reverse-text", {"split": "eval", "num_tasks": 200})[:n_tasks]
    out = []
    async with httpx.AsyncClient(timeout=120) as http:
        for version, path in enumerate(paths):
            if path is not None:
                r = await http.post(f"{url}/update_weights", json={"path": path, "version": version})
                r.raise_for_status()
            runs = await asyncio.gather(*(evaluate(tasks, url, "tiny", max_tokens=max_tokens, temperature=1.0, seed=s,
                                                   concurrency=n_tasks) for s in EVAL_SEEDS))
            rewards = [row["reward"] for rs in runs for row in rs]
            out.append(sum(rewards) / len(rewards))
    return out


def evaluate_runs(runs: list[dict], work: Path, n_tasks: int, max_tokens: int) -> None:
    """Turn each run's kept checkpoints ({"t": seconds, "path": step directory}) into its curve
    [(seconds, held-out reward)], starting from (0, the starting model's reward)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (work / "evaluator.log").open("w") as log:
        server = subprocess.Popen([sys.executable, "-m", "composer_prime.entrypoints.inference", "--model", "tiny",
                                   "--engine", "hf", "--port", str(port), "--output_dir", str(work / "evaluator")],
                                  stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent(signal.SIGTERM))
        try:
            deadline = time.time() + 300
            while not healthy(url):
                if server.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"the evaluator's inference server did not start (log: {work / 'evaluator.log'})")
                time.sleep(0.5)
            paths = [None] + [c["path"] for r in runs for c in r["checkpoints"]]
            rewards = iter(asyncio.run(heldout_rewards(url, paths, n_tasks, max_tokens)))
            start = next(rewards)
            for r in runs:
                r["curve"] = [(0.0, start)] + [(c["t"], next(rewards)) for c in r.pop("checkpoints")]
        finally:
            server.terminate()
            server.wait(timeout=60)


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False

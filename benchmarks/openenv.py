"""tool-calc in-process against the same environment served over OpenEnv: rollouts/s, in one run.

    uv run --extra openenv python benchmarks/openenv.py [--steps 5] [--batch 64] [--repeats 5]
                                                        [--sft-steps 200] [--results DIR] [--work DIR]

One inference server (embedded engine) and one `composer-prime env serve tool-calc` (OpenEnv, with
a session for every rollout of a batch) are started; the orchestrator's own `collect` (the
environment's episodes, every turn sampled through the inference server's token route, scoring,
advantages) then runs `--steps` batches of `--batch` rollouts on tool-calc loaded in-process (a
verifiers environment), and as many on the OpenEnv server driven over its /ws route (an openenv
environment with its url): the same tasks, the same sampling seeds. The two take turns batch by
batch, so a change in the machine's speed falls on both. The policy is the tiny model
warm-started on tool-calc demonstrations (`--sft-steps`, as benchmarks/distill_ab.py; 0: the tiny
model as it is), so episodes call the tool.

Prints a table and writes <results>/openenv.json (default benchmarks/results): per system every
repeat's rollouts/s, mean reward and tool calls per rollout; median and range; the slowdown of
OpenEnv against in-process per repeat, against the target of at most 10%; stamped with the
machine, the date and the commit. Scratch files (the warm start, the servers' logs) go under
<work> (default outputs/bench-openenv), created if missing.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distill_ab import ROOT, warm_start  # noqa: E402
from replay_ab import serving  # noqa: E402
from support.cli import commit, git  # noqa: E402
from support.heldout import healthy  # noqa: E402
from support.spread import spread  # noqa: E402

from composer_prime.utils.logs import setup  # noqa: E402
from composer_prime.utils.net import free_port  # noqa: E402
from composer_prime.utils.proc import die_with_parent  # noqa: E402
from composer_prime.utils.progress import Progress  # noqa: E402

TASKS = {"num_tasks": 1000, "max_operand": 99}  # tool-calc's questions as the warm start learnt them, the same on
# both sides (OpenEnv: reset(seed=i) is question i of the served taskset)
TARGET = 0.10  # at most 10% slower over OpenEnv


def serve_tool_calc(work: Path, sessions: int) -> tuple[str, subprocess.Popen]:
    """`composer-prime env serve tool-calc` on a free port; (its URL, its process) once it is healthy."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (work / "env-serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "composer_prime.entrypoints.cli", "env", "serve", "tool-calc", "--port",
                             str(port), "--max-concurrent-envs", str(sessions), "--args", json.dumps(TASKS)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent(signal.SIGTERM))
    deadline = time.time() + 300
    while not healthy(url):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            sys.exit(f"env serve tool-calc did not start (log: {work / 'env-serve.log'})")
        time.sleep(0.5)
    return url, proc


def orchestrator(model: Path, url: str, env: dict, batch: int, work: Path):
    from composer_prime.config import OrchestratorConfig
    from composer_prime.orchestrator.orchestrator import Orchestrator

    return Orchestrator(OrchestratorConfig.model_validate({
        "model": str(model), "output_dir": str(work / "orchestrator"), "inference_urls": [url], "batch_size": batch,
        "group_size": 8, "seq_len": 256, "sampling": {"max_tokens": 48}, "dynamic_sampling": False,
        "max_async_level": 10**6,  # one policy throughout: no rollout is stale, every step keeps its batch
        "max_concurrency": batch, "envs": [{"id": "tool-calc", "max_turns": 3, "args": TASKS, **env}]}))


async def batch(o, step: int) -> tuple[float, list]:
    """One batch collected and built: (seconds, its rollouts)."""
    start = time.perf_counter()
    c = await o.collect(step)
    await o.build(step, c)
    return time.perf_counter() - start, [r for g, _ in c.groups for r in g]


def figures(seconds: float, rollouts: list) -> dict:
    return {"rollouts": len(rollouts), "seconds": round(seconds, 3), "rollouts_per_s": len(rollouts) / seconds,
            "reward": sum(r.reward for r in rollouts) / len(rollouts),
            "tool_calls": sum(r.metrics.get("tool_calls", 0) for r in rollouts) / len(rollouts)}


async def race(systems: dict, steps: int, repeats: int) -> list[dict]:
    """Every repeat: `steps` batches per system, the systems taking turns batch by batch (the order
    alternating), on the same batches' tasks and seeds."""
    for o in systems.values():
        await o.envs[0].env.start()
        await o.client.wait_ready()
        await batch(o, 10**6)  # warm-up, untimed: sessions opened, the servers' first requests
    runs = []
    try:
        with Progress("openenv", total=repeats * len(systems), unit="runs") as progress:
            for i in range(repeats):
                spent = {name: [0.0, []] for name in systems}
                for step in range(i * steps, (i + 1) * steps):
                    for name in (list(systems) if step % 2 == 0 else list(reversed(systems))):
                        seconds, rollouts = await batch(systems[name], step)
                        spent[name][0] += seconds
                        spent[name][1] += rollouts
                for name, (seconds, rollouts) in spent.items():
                    runs.append({"system": name, "repeat": i, **figures(seconds, rollouts)})
                    progress.advance(1, note=f"{name} {runs[-1]['rollouts_per_s']:.1f} rollouts/s")
    finally:
        for o in systems.values():
            await o.envs[0].env.close()
            await o.client.close()
    return runs


def stamp() -> dict:
    return {"machine": f"{platform.machine()} cores={os.cpu_count()}", "python": platform.python_version(),
            "date": datetime.date.today().isoformat(), "commit": commit(),
            "runtime_changed_since_commit": bool(git("status", "--porcelain", "--", "composer_prime/env_runtime"))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5, help="batches per system and repeat")
    p.add_argument("--batch", type=int, default=64, help="rollouts per batch (groups of 8)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sft-steps", type=int, default=200, help="warm start on tool-calc demonstrations (0: none)")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-openenv")
    a = p.parse_args()
    if a.steps < 1 or a.repeats < 1 or a.batch < 8 or a.batch % 8:
        p.error("--steps and --repeats must be at least 1, --batch a positive multiple of 8")
    setup("openenv", stderr=True)  # the progress lines; the table goes to stdout
    work = a.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = warm_start(work, 4 * a.sft_steps, a.sft_steps) if a.sft_steps else Path("tiny")
    serve_url, server = serve_tool_calc(work, a.batch)
    try:
        with serving({"policy": model}, work) as urls:
            served = {"kind": "openenv", "url": serve_url, "sessions": a.batch, "args": {"num_tasks": TASKS["num_tasks"]}}
            systems = {"in-process": orchestrator(model, urls["policy"], {}, a.batch, work),
                       "openenv": orchestrator(model, urls["policy"], served, a.batch, work)}
            runs = asyncio.run(race(systems, a.steps, a.repeats))
    finally:
        server.terminate()
        server.wait(timeout=60)
    rate = {name: [r["rollouts_per_s"] for r in runs if r["system"] == name] for name in systems}
    slowdown = [1 - o / i for i, o in zip(rate["in-process"], rate["openenv"])]
    summary = {name: {f: spread([r[f] for r in runs if r["system"] == name]) for f in ("rollouts_per_s", "reward", "tool_calls")}
               for name in systems}
    result = {**stamp(), "steps": a.steps, "batch": a.batch, "repeats": a.repeats, "sft_steps": a.sft_steps,
              "summary": summary, "slowdown": spread(slowdown), "target": TARGET,
              "target_met": spread(slowdown)["median"] <= TARGET, "runs": runs}
    a.results.mkdir(parents=True, exist_ok=True)
    out = a.results / "openenv.json"
    out.write_text(json.dumps(result, indent=2))
    print("\n| system | rollouts/s | reward | tool calls per rollout |\n|---|---|---|---|")
    for name, s in summary.items():
        print(f"| {name} | " + " | ".join(f"{s[f]['median']} [{s[f]['min']}, {s[f]['max']}]" for f in s) + " |")
    s = result["slowdown"]
    print(f"\nOpenEnv slower by {s['median']:.1%} [{s['min']:.1%}, {s['max']:.1%}] (target at most {TARGET:.0%}: "
          f"{'met' if result['target_met'] else 'not met'}); median [range] over {a.repeats} repeats of {a.steps} "
          f"batches of {a.batch}, {result['machine']}, {result['date']}, commit {result['commit']}\n\nwritten {out}")


if __name__ == "__main__":
    main()

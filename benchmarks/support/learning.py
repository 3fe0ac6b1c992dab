"""real_model.py's `learning` result: does the device's shipped SmolLM2 config learn within its budget?

For each seed (--seeds), the device's config (configs/smollm2-135m.toml on the CPU, -gpu.toml on
CUDA, or --config with --rl-flags) runs as shipped but for --minutes of wall time (45 on the CPU, 10 on CUDA: the targets of
issue 25), its steps raised so that the clock, not max_steps, ends it; or, with --max-steps N, for N steps and
no clock at all (what a test runs: a budget in steps holds on a host of any speed). From the orchestrator's
metrics: the held-out reward at each evaluation (the config's interval) against minutes since
launch; the rise from the first evaluation (the converted weights) to the last one inside the
budget. Also start-up (launch to the first step), steps done, seconds per step, peak RSS per
process, each run's wall time (launch to exit, shutdown included) and the machine's load average
before and after. `--parallel N` runs N seeds at once (support/runs.py), on `--device cuda` all on
one GPU: then each run's minutes are minutes of a shared machine (as its load average shows).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
from pathlib import Path

from composer_prime.utils.net import free_port
from composer_prime.utils.report import metrics_rows
from support.breakdown import CONFIGS, PROCESSES, inference_port
from support.cli import device_env, device_flags, share_flags
from support.runs import Job, exit_if_failed, run_all, span, table as runs_table

ROOT = Path(__file__).resolve().parents[2]
MINUTES = {"cpu": 45.0, "cuda": 10.0}


def job(a: argparse.Namespace, seed: int) -> tuple[Job, list[str]]:
    """One seed's run, the config as shipped on the device and stopped after --minutes (or at --max-steps);
    and its rl arguments as the result shows them (no ports: they are this machine's)."""
    run = a.work / f"learning-{a.device}-seed{seed}"
    shutil.rmtree(run, ignore_errors=True)
    shown = run.relative_to(ROOT) if run.is_relative_to(ROOT) else run
    flags = shlex.split(a.rl_flags)
    args = ["@", a.config, "--output_dir", str(shown), "--seed", str(seed), "--max_steps", str(a.max_steps or 100000),
            *device_flags(a.device), *flags]
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", *args, "--inference.port", str(inference_port()),
           "--transport.address", f"tcp://127.0.0.1:{free_port()}", *share_flags(a.device, a.parallel, flags)]
    budget = None if a.max_steps else a.minutes * 60
    return Job(f"seed {seed}", cmd, run / "bench.log", budget, device_env(a.device)), args


def one_seed(a: argparse.Namespace, seed: int, args: list[str], r: dict, load: float) -> dict:
    """What the seed's run (its record `r`, support/runs.py) measured; exits when it evaluated nothing in time."""
    run = a.work / f"learning-{a.device}-seed{seed}"
    for heavy in ("weights", "checkpoints"):  # GBs a run of this size (optimizer state included): read nothing there
        shutil.rmtree(run / heavy, ignore_errors=True)
    orch = metrics_rows(run / "orchestrator" / "metrics.jsonl")
    trainer = metrics_rows(run / "trainer" / "metrics.jsonl")
    start = r["start"]
    evals = [{"minute": round((m["time"] - start) / 60, 2), "step": m["step"], "version": m.get("eval_version"),
              "reward": m["eval_reward"]} for m in orch if "eval_reward" in m and (a.max_steps or m["time"] - start <= a.minutes * 60)]
    if not evals:
        raise SystemExit(f"seed {seed} evaluated nothing within {budget_words(a)}")
    steps = [m["time"] for m in trainer]
    return {"seed": seed, "command": " ".join(["rl", *args]), "load_average": [load, os.getloadavg()[0]],
            "startup_s": round(orch[0]["time"] - orch[0].get("wait_s", 0) - start, 1) if orch else None,
            "steps": len(trainer), "step_s": round(statistics.median(b - a_ for a_, b in zip(steps, steps[1:])), 2)
            if len(steps) > 2 else None, "peak_rss_mb": {p: r["peak_rss_mb"].get(p, 0) for p in PROCESSES},
            "evals": evals, "rise": round(evals[-1]["reward"] - evals[0]["reward"], 4),
            "start": r["start"], "end": r["end"], "wall_s": r["wall_s"]}


def budget_words(a: argparse.Namespace) -> str:
    return f"{a.max_steps} steps" if a.max_steps else f"{a.minutes:g} minutes"


def learning(a: argparse.Namespace) -> dict:
    a.minutes = None if a.max_steps else (a.minutes or MINUTES[a.device])
    config = Path(a.config).resolve() if a.config else ROOT / CONFIGS[a.device]  # rl runs in ROOT
    a.config = str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(config)
    jobs = {seed: job(a, seed) for seed in a.seeds}  # seed -> (its Job, its rl arguments)
    by_name = {j.name: seed for seed, (j, _) in jobs.items()}
    load, seeds = os.getloadavg()[0], {}

    def done(j: Job, r: dict) -> str:
        seed = by_name[j.name]
        seeds[seed] = s = one_seed(a, seed, jobs[seed][1], r, load)
        return f"held-out {s['evals'][0]['reward']:.3f} -> {s['evals'][-1]['reward']:.3f} in {s['steps']} steps"

    records = run_all([j for j, _ in jobs.values()], a.parallel, "learning", done)
    print(runs_table(records, a.parallel) + "\n")
    exit_if_failed(records)
    out = [seeds[s] for s in a.seeds]
    return {"config": a.config, "rl_flags": a.rl_flags, "minutes": a.minutes, "max_steps": a.max_steps, "cores": os.cpu_count(),
            "parallel": a.parallel, "wall": span(records), "seeds": out,
            "rises_on_every_seed": all(s["rise"] > 0 for s in out)}


def table(name: str, r: dict) -> str:
    budget = f"{r['max_steps']} steps" if r.get("max_steps") else f"{r['minutes']:g} minutes of wall time"
    rows = [f"{name} on {r['machine']}, {r['date']}, commit {r['commit']}: {r['config']} for {budget} "
            f"per seed, {r['cores']} cores, {r.get('parallel', 1)} at once", "| seed | start-up s | steps | s/step | "
            "held-out: first -> last (minute) | rise | wall s | load average | peak RSS MB (inference / orchestrator / "
            "trainer) |", "|---|---|---|---|---|---|---|---|---|"]
    for s in r["seeds"]:
        first, last = s["evals"][0], s["evals"][-1]
        rows.append(f"| {s['seed']} | {s['startup_s']} | {s['steps']} | {s['step_s']} | {first['reward']:.3f} -> "
                    f"{last['reward']:.3f} ({last['minute']:.0f}) | {s['rise']:+.3f} | {s.get('wall_s', '')} | {s['load_average'][0]:.1f} to "
                    f"{s['load_average'][1]:.1f} | {' / '.join(str(s['peak_rss_mb'][p]) for p in PROCESSES)} |")
    return "\n".join(rows)


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s in r["seeds"]:
        ax.plot([e["minute"] for e in s["evals"]], [e["reward"] for e in s["evals"]], "o-", label=f"seed {s['seed']}")
    ax.set_xlabel("minutes since launch")
    ax.set_ylabel("held-out reward")
    ax.set_title(f"{r['config']}, {r['machine']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)

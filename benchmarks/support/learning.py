"""real_model.py's `learning` result: does the device's shipped SmolLM2 config learn within its budget?

For each seed (--seeds), the device's config (configs/smollm2-135m.toml on the CPU, -gpu.toml on
CUDA, or --config with --rl-flags) runs as shipped but for --minutes of wall time (45 on the CPU, 10 on CUDA: the targets of
issue 25), its steps raised so that the clock, not max_steps, ends it. From the orchestrator's
metrics: the held-out reward at each evaluation (the config's interval) against minutes since
launch; the rise from the first evaluation (the converted weights) to the last one inside the
budget. Also start-up (launch to the first step), steps done, seconds per step, peak RSS per
process, and the machine's load average before and after.
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
from composer_prime.utils.progress import Progress
from composer_prime.utils.report import metrics_rows
from support.breakdown import CONFIGS, PROCESSES, inference_port
from support.timed import run_timed

ROOT = Path(__file__).resolve().parents[2]
MINUTES = {"cpu": 45.0, "cuda": 10.0}


def one_seed(a: argparse.Namespace, seed: int) -> dict:
    run = a.work / f"learning-{a.device}-seed{seed}"
    shutil.rmtree(run, ignore_errors=True)
    shown = run.relative_to(ROOT) if run.is_relative_to(ROOT) else run
    args = ["@", a.config, "--output_dir", str(shown), "--seed", str(seed), "--max_steps", "100000", *shlex.split(a.rl_flags)]
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", *args, "--inference.port", str(inference_port()),
           "--transport.address", f"tcp://127.0.0.1:{free_port()}"]
    load = os.getloadavg()[0]
    start, _, _, peaks = run_timed(cmd, ROOT, a.minutes * 60, run / "bench.log")
    for heavy in ("weights", "checkpoints"):
        shutil.rmtree(run / heavy, ignore_errors=True)
    orch = metrics_rows(run / "orchestrator" / "metrics.jsonl")
    trainer = metrics_rows(run / "trainer" / "metrics.jsonl")
    evals = [{"minute": round((r["time"] - start) / 60, 2), "step": r["step"], "version": r.get("eval_version"),
              "reward": r["eval_reward"]} for r in orch if "eval_reward" in r and r["time"] - start <= a.minutes * 60]
    if not evals:
        raise SystemExit(f"learning: seed {seed} evaluated nothing within {a.minutes} minutes (log: {run / 'bench.log'})")
    steps = [r["time"] for r in trainer]
    return {"seed": seed, "command": " ".join(["rl", *args]), "load_average": [load, os.getloadavg()[0]],
            "startup_s": round(orch[0]["time"] - orch[0].get("wait_s", 0) - start, 1) if orch else None,
            "steps": len(trainer), "step_s": round(statistics.median(b - a_ for a_, b in zip(steps, steps[1:])), 2)
            if len(steps) > 2 else None, "peak_rss_mb": {p: round(peaks.get(p, 0) / 2**20) for p in PROCESSES},
            "evals": evals, "rise": round(evals[-1]["reward"] - evals[0]["reward"], 4)}


def learning(a: argparse.Namespace) -> dict:
    a.minutes = a.minutes or MINUTES[a.device]
    config = Path(a.config).resolve() if a.config else ROOT / CONFIGS[a.device]  # rl runs in ROOT
    a.config = str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(config)
    seeds = []
    with Progress("learning", len(a.seeds), "runs") as progress:
        for seed in a.seeds:
            seeds.append(one_seed(a, seed))
            progress.advance(note=f"seed {seed}: held-out {seeds[-1]['evals'][0]['reward']:.3f} -> "
                                  f"{seeds[-1]['evals'][-1]['reward']:.3f}")
    return {"config": a.config, "rl_flags": a.rl_flags, "minutes": a.minutes, "cores": os.cpu_count(), "seeds": seeds,
            "rises_on_every_seed": all(s["rise"] > 0 for s in seeds)}


def table(name: str, r: dict) -> str:
    rows = [f"{name} on {r['machine']}, {r['date']}, commit {r['commit']}: {r['config']} for {r['minutes']:g} minutes "
            f"of wall time per seed, {r['cores']} cores", "| seed | start-up s | steps | s/step | held-out: first -> last "
            "(minute) | rise | load average | peak RSS MB (inference / orchestrator / trainer) |", "|---|---|---|---|---|---|---|---|"]
    for s in r["seeds"]:
        first, last = s["evals"][0], s["evals"][-1]
        rows.append(f"| {s['seed']} | {s['startup_s']} | {s['steps']} | {s['step_s']} | {first['reward']:.3f} -> "
                    f"{last['reward']:.3f} ({last['minute']:.0f}) | {s['rise']:+.3f} | {s['load_average'][0]:.1f} to "
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

"""End-of-run summary: report.md, summary.json and reward.png in the run directory."""

from __future__ import annotations

import json
from pathlib import Path


def _rows(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def summarize(run: Path, wall_s: float | None = None) -> dict:
    orch = _rows(run / "orchestrator" / "metrics.jsonl")
    trainer = _rows(run / "trainer" / "metrics.jsonl")
    evals = [(r["step"], r["eval_reward"]) for r in orch if "eval_reward" in r]
    train = [(r["step"], r["reward"]) for r in orch if "reward" in r]
    rollouts = sum(r.get("rollouts", 0) for r in orch)
    if wall_s is None and orch:
        wall_s = orch[-1]["time"] - orch[0]["time"]
    compute = sum(r["compute_s"] for r in trainer)
    return {
        "steps": len(trainer),
        "wall_s": wall_s,
        "rollouts": rollouts,
        "rollouts_per_s": rollouts / wall_s if wall_s else None,
        "trainer_busy_fraction": compute / wall_s if wall_s else None,
        "heldout_reward_start": evals[0][1] if evals else None,
        "heldout_reward_end": evals[-1][1] if evals else None,
        "eval_curve": evals,
        "train_curve": train,
    }


def write_report(run: Path, wall_s: float | None = None) -> dict:
    s = summarize(run, wall_s)
    (run / "summary.json").write_text(json.dumps(s, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    if s["train_curve"]:
        ax.plot(*zip(*s["train_curve"]), label="train reward (batch mean)", alpha=0.6)
    if s["eval_curve"]:
        ax.plot(*zip(*s["eval_curve"]), "o-", label="held-out reward")
    ax.set_xlabel("trainer step")
    ax.set_ylabel("reward")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(run / "reward.png", dpi=100)
    plt.close(fig)
    fmt = lambda v, f="{:.3f}": "n/a" if v is None else f.format(v)  # noqa: E731
    (run / "report.md").write_text(
        f"# Run report: {run}\n\n"
        f"- steps: {s['steps']}\n- wall time: {fmt(s['wall_s'], '{:.0f}')} s\n"
        f"- rollouts: {s['rollouts']} ({fmt(s['rollouts_per_s'], '{:.1f}')}/s)\n"
        f"- trainer busy fraction: {fmt(s['trainer_busy_fraction'])}\n"
        f"- held-out reward: {fmt(s['heldout_reward_start'])} → {fmt(s['heldout_reward_end'])}\n\n"
        "![reward](reward.png)\n"
    )
    return s

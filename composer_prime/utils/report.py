"""End-of-run summary: report.md, summary.json and reward.png in the run directory, with where
each process spent its time per step (from the timings the orchestrator and trainer record).

A run continued with `--resume` is reported whole: its wall time is the sum of its segments'
(utils/report_segments.py), the report says where it was resumed, and step times are taken within
a segment only (never across a stop and the pause before its resume).
"""

from __future__ import annotations

import json
from pathlib import Path

from composer_prime.utils import report_segments


def metrics_rows(path: Path) -> list[dict]:
    """The JSON lines of a metrics file (none if it does not exist)."""
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def volunteers_line(row: dict) -> str | None:
    """The volunteers' counts in a metrics row (volunteer/pool.py's), in words; None without volunteers."""
    if "volunteers/healthy" not in row:
        return None
    per_node = [(k.split("/")[2], v) for k, v in row.items() if k.startswith("volunteers/") and k.count("/") == 2
                and not k.startswith("volunteers/refused/")]
    total = lambda pick: sum(v for what, v in per_node if pick(what))  # noqa: E731
    return (f"volunteers {row['volunteers/healthy']:.0f} healthy, {row['volunteers/ejected']:.0f} ejected; "
            f"{total(lambda w: w == 'accepted'):.0f} of {total(lambda w: w == 'leased'):.0f} leases accepted, "
            f"{total(lambda w: w.startswith('rejected')):.0f} rejected")


def hint_lift_line(orch: list[dict]) -> str | None:
    """The distill step's hint lift per error kind over the run (its last row that has one), in words;
    None where the run did not measure it (orchestrator.distill.lift_samples = 0)."""
    row = next((r for r in reversed(orch) if any(k.startswith("distill/hint_lift/") for k in r)), None)
    if row is None:
        return None
    kinds = sorted(k.split("/", 2)[2] for k in row if k.startswith("distill/hint_lift/"))
    return "hint lift (distill/hint_lift, H [95% CI], sites): " + "; ".join(
        f"{k} {row[f'distill/hint_lift/{k}']:+.3f} [{row[f'distill/hint_lift_lo/{k}']:+.3f}, "
        f"{row[f'distill/hint_lift_hi/{k}']:+.3f}], {row[f'distill/hint_lift_sites/{k}']:.0f}"
        + ("" if row.get(f"distill/gate/{k}", 1.0) else " (gated off)") for k in kinds)


def _mean(rows: list[dict], key) -> float:
    return sum(key(r) if callable(key) else r.get(key, 0.0) for r in rows) / max(1, len(rows))


def time_breakdown(run: Path, inference: dict | None = None, skip: int = 2) -> dict:
    """Seconds per step, by process and phase: means over the trainer's steps after the first
    `skip` + 1 (start-up: first batches, warm caches), and the orchestrator's steps of the same
    numbers. A trainer row holds the hand-off (checkpoint, publish) that preceded its step, so
    idle + compute + hand-off of those rows add up to their step time. `inference`: the server's
    /health answer, for its weight loads. Inference works only while the orchestrator waits for
    generation or evaluation, or while it loads weights, so its idle time is at least the rest."""
    rows = [r for r in metrics_rows(run / "trainer" / "metrics.jsonl") if "wait_s" in r]
    skip = max(0, min(skip, len(rows) - 2))  # a short run of slow steps (a real model's): skip fewer, still say where time went
    trainer = [r for r in rows if r["step"] >= skip]
    segments = report_segments.load(run)
    # each step after one of the same segment: its time is the gap between their rows
    pairs = [(a, b) for a, b in zip(trainer, trainer[1:])
             if report_segments.index(segments, a["time"]) == report_segments.index(segments, b["time"])]
    steps = {b["step"] for _, b in pairs}
    orch = [r for r in metrics_rows(run / "orchestrator" / "metrics.jsonl") if "collect_s" in r and r["step"] in steps]
    if not steps or not orch:
        return {}
    step_s = sum(b["time"] - a["time"] for a, b in pairs) / len(pairs)
    phases = ("pack_s", "forward_s", "backward_s", "optim_s")
    trainer = [b for _, b in pairs]
    out = {"steps": len(steps), "skipped": skip + 1, "step_s": step_s,
           "orchestrator": {"generate_and_score_s": _mean(orch, "collect_s"), "build_batch_s": _mean(orch, "build_s"),
                            "send_s": _mean(orch, "send_s"), "eval_s": _mean(orch, "eval_s"), "idle_s": _mean(orch, "wait_s")},
           "trainer": {"idle_s": _mean(trainer, "wait_s"), **{k: _mean(trainer, k) for k in phases},
                       "other_compute_s": _mean(trainer, lambda r: r["compute_s"] - sum(r.get(k, 0.0) for k in phases)),
                       "checkpoint_s": _mean(trainer, "ckpt_s"), "publish_s": _mean(trainer, "publish_s")}}
    load_s = (inference or {}).get("load_s", 0.0) / max(1, (inference or {}).get("updates", 0))
    busy = out["orchestrator"]["generate_and_score_s"] + out["orchestrator"]["eval_s"] + load_s
    out["inference"] = {"load_s": load_s if inference else None, "idle_s": max(0.0, step_s - busy)}
    return out


def summarize(run: Path, wall_s: float | None = None) -> dict:
    orch = metrics_rows(run / "orchestrator" / "metrics.jsonl")
    trainer = metrics_rows(run / "trainer" / "metrics.jsonl")
    evals = [(r["step"], r["eval_reward"]) for r in orch if "eval_reward" in r]
    train = [(r["step"], r["reward"]) for r in orch if "reward" in r]
    rollouts = sum(r.get("rollouts", 0) for r in orch)
    segments = report_segments.load(run)
    walls = report_segments.wall_times(segments, [r["time"] for r in orch + trainer if "time" in r])
    if segments:  # every segment of the run, not only the last rl's
        wall_s = sum(walls)
    elif wall_s is None and orch:
        wall_s = orch[-1]["time"] - orch[0]["time"]
    compute = sum(r["compute_s"] for r in trainer)
    return {
        "steps": len(trainer),
        "wall_s": wall_s,
        "segments": [{"step": s["step"], "wall_s": w} for s, w in zip(segments, walls)],  # one per rl: [] without a record
        "rollouts": rollouts,
        "rollouts_per_s": rollouts / wall_s if wall_s else None,
        "trainer_busy_fraction": compute / wall_s if wall_s else None,
        "heldout_reward_start": evals[0][1] if evals else None,
        "heldout_reward_end": evals[-1][1] if evals else None,
        "eval_curve": evals,
        "train_curve": train,
        "time_per_step": time_breakdown(run),
        "volunteers": next((volunteers_line(r) for r in reversed(orch) if "volunteers/healthy" in r), None),
        "hint_lift": hint_lift_line(orch),
    }


def resumed_words(segments: list[dict]) -> str:
    """' in 2 segments, resumed at step 20 (412 + 142 s)' for a resumed run; '' for one that ran in one go."""
    if len(segments) < 2:
        return ""
    at = ", ".join(str(s["step"]) for s in segments[1:])
    walls = " + ".join(f"{s['wall_s']:.0f}" for s in segments)
    return f" in {len(segments)} segments, resumed at step {at} ({walls} s)"


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
    t = s["time_per_step"]
    where = (f"- seconds per step ({fmt(t['step_s'], '{:.2f}')} s, the mean of {t['steps']} after the first {t['skipped']}): trainer idle {t['trainer']['idle_s']:.2f}, "
             f"forward {t['trainer']['forward_s']:.2f}, backward {t['trainer']['backward_s']:.2f}, optimizer "
             f"{t['trainer']['optim_s']:.2f}, checkpoint {t['trainer']['checkpoint_s']:.2f}, publish "
             f"{t['trainer']['publish_s']:.2f}; generation {t['orchestrator']['generate_and_score_s']:.2f}, "
             f"orchestrator idle {t['orchestrator']['idle_s']:.2f}\n") if t else ""
    (run / "report.md").write_text(
        f"# Run report: {run}\n\n"
        f"- steps: {s['steps']}\n- wall time: {fmt(s['wall_s'], '{:.0f}')} s{resumed_words(s['segments'])}\n"
        f"- rollouts: {s['rollouts']} ({fmt(s['rollouts_per_s'], '{:.1f}')}/s)\n"
        f"- trainer busy fraction: {fmt(s['trainer_busy_fraction'])}\n"
        f"- held-out reward: {fmt(s['heldout_reward_start'])} → {fmt(s['heldout_reward_end'])}\n{where}"
        + (f"- {s['volunteers']}\n" if s["volunteers"] else "")
        + (f"- {s['hint_lift']}\n" if s["hint_lift"] else "") + "\n"
        "![reward](reward.png)\n"
    )
    return s

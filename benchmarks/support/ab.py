"""What the two tool-calc A/Bs (distill_ab.py, replay_ab.py) share: their common arguments, the warm
start, one stage run to its end, the arms x seeds as `rl` runs side by side (support/runs.py; a run
whose recorded command is the same is reused, with its recorded wall time), the held-out figures
read from a run, the fields every result holds (stamp, each run's wall time) and the plot."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from composer_prime.utils.net import free_port

from .cli import add_run_args, check_run_args, device_env, device_flags, share_flags, stamp
from .runs import Job, exit_if_failed, run_all, span, table

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ["@", "configs/tool-calc-distill.toml"]
ENVS = ('[{id = "tool-calc", max_turns = 3, args = {max_operand = 99}, '
        'eval_args = {split = "eval", num_tasks = 200, max_operand = 99}}]')


def add_ab_args(p: argparse.ArgumentParser) -> None:
    """The arguments both A/Bs take: where and how many at once, the warm start, and the directories."""
    p.add_argument("--seeds", default="0,1,2", help="seeds, comma-separated: each arm runs on each")
    p.add_argument("--steps", type=int, default=20, help="rl steps per run")
    p.add_argument("--rl-flags", default="", help="extra rl flags for every run, e.g. '--orchestrator.eval.num_tasks 8'")
    add_run_args(p)
    p.add_argument("--model", default="tiny", help="the model the warm start begins from (e.g. smollm2-135m)")
    p.add_argument("--sft-steps", type=int, default=800, help="SFT steps of the warm start")
    p.add_argument("--sft-lr", type=float, default=1e-3, help="SFT learning rate of the warm start (and teachers)")
    p.add_argument("--demos", type=int, default=4000, help="demonstrations the warm start (and teachers) learn from")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--work", type=Path, help="the warm start and the runs (default outputs/<benchmark>[-<model>])")


def check_ab_args(p: argparse.ArgumentParser, a: argparse.Namespace, name: str) -> None:
    """Bad input as one line (exit 2); a.seeds parsed, a.work resolved (one per base model by default,
    so that a warm start from another model is never reused)."""
    check_run_args(p, a)
    try:
        a.seeds = [int(x) for x in a.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds wants comma-separated integers, got {a.seeds!r}")
    if a.steps < 1:
        p.error(f"--steps must be at least 1, got {a.steps}")
    suffix = "" if a.model == "tiny" else "-" + Path(a.model).name
    a.work = (a.work or ROOT / "outputs" / f"{name.replace('_', '-')}{suffix}").resolve()


def run(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    """One stage (an SFT run, a replay), run to its end; its failure stops the benchmark, naming its log."""
    with log.open("w") as f:
        if subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                          env={**os.environ, **env} if env else None).returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)} (log: {log})")


def warm_start(out: Path, n_demos: int, sft_steps: int, name: str = "agent", base: str = "tiny",
               error_rate: float = 0.5, lr: float = 1e-3, env: dict[str, str] | None = None) -> Path:
    """The shared starting point, built once and reused (delete it to rebuild). `base`, `name` and
    `error_rate` let replay_ab.py continue it on cleaner demonstrations into stronger teachers."""
    agent = out / name
    if (agent / "model.safetensors").exists():
        return agent
    sys.path.insert(0, str(ROOT / "environments" / "tool-calc"))
    from tool_calc.demos import demonstrations

    out.mkdir(parents=True, exist_ok=True)
    demos = out / f"{name}-demos.jsonl"
    rows = demonstrations(n_demos, error_rate=error_rate, seed=0, max_operand=99)
    demos.write_text("".join(json.dumps(d) + "\n" for d in rows))
    print(f"{name}: {sft_steps} SFT steps from {base} on {n_demos} tool-calc demonstrations", flush=True)
    run([sys.executable, "-m", "composer_prime.entrypoints.sft", "--model", base, "--data", str(demos),
         "--output_dir", str(agent), "--max_steps", str(sft_steps), "--batch_size", "16", "--lr", str(lr),
         "--warmup_steps", "20"], out / f"{name}-sft.log", env)
    return agent


def finished(run_dir: Path, args: list[str]) -> bool:
    """A run is reused when it ended (`rl` writes summary.json last) with these very arguments."""
    done, recorded = run_dir / "summary.json", run_dir / "ab-command.json"
    return done.exists() and recorded.exists() and json.loads(recorded.read_text()) == args


def evals(run_dir: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (run_dir / "orchestrator" / "metrics.jsonl").read_text().splitlines()]
    return [{"step": r["step"], "tool_error_rate": r["eval/tool-calc/tool_error_rate"], "reward": r["eval_reward"],
             "tool_calls": r["eval/tool-calc/tool_calls"]} for r in rows if "eval_reward" in r]


def rl_runs(runs: dict[str, tuple[Path, int, int, list[str]]], model: Path, a: argparse.Namespace, label: str,
            note: Callable[[str, Path], str]) -> list[dict]:
    """Each of `runs` (name -> (output directory, seed, steps, flags)): `rl @ configs/tool-calc-distill.toml`
    from `model` on tool-calc, on a.device, a.parallel at a time. A finished run with the same
    command is reused. Returns each run's record (support/runs.py); `note(name, dir)` gives the
    figures its line shows as it ends."""
    jobs, reused, kept = [], {}, {}  # kept: name -> (its directory, its command as recorded there)
    for name, (out, seed, steps, flags) in runs.items():
        args = [*CONFIG, "--model", str(model), "--output_dir", str(out), "--seed", str(seed), "--max_steps",
                str(steps), "--orchestrator.envs", ENVS, *device_flags(a.device), *flags]
        if finished(out, args):
            wall = out / "ab-wall.json"
            reused[name] = {"name": name, "status": "reused", "log": str(out.parent / f"{out.name}.log"),
                            **(json.loads(wall.read_text()) if wall.exists() else {"wall_s": None})}
            print(f"{label}: {name} reused: {note(name, out)}", flush=True)
            continue
        cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", *args, "--inference.port", str(free_port()),
               "--transport.address", f"tcp://127.0.0.1:{free_port()}", *share_flags(a.device, a.parallel, flags)]
        jobs.append(Job(name, cmd, out.parent / f"{out.name}.log", env=device_env(a.device)))
        kept[name] = (out, args)

    def done(job: Job, r: dict) -> str:
        out, args = kept[job.name]
        (out / "ab-command.json").write_text(json.dumps(args))
        (out / "ab-wall.json").write_text(json.dumps({k: r[k] for k in ("start", "end", "wall_s")}))
        return note(job.name, out)

    ran = {r["name"]: r for r in run_all(jobs, a.parallel, label, done)}
    return [reused.get(name) or ran[name] for name in runs]


def held_out(rows: list[dict]) -> str:
    first, last = rows[0], rows[-1]
    return (f"held-out reward {first['reward']:.3f} -> {last['reward']:.3f}, tool-error rate "
            f"{first['tool_error_rate']:.3f} -> {last['tool_error_rate']:.3f}")


def arms_x_seeds(arms: dict[str, list[str]], model: Path, a: argparse.Namespace, label: str) -> tuple[dict, list[dict]]:
    """Every arm on every seed (in <work>/<arm>-s<seed>; seed by seed, the arms taking turns, so that
    a change in the machine's load falls on each); prints the runs' table, and exits non-zero if any
    failed. Returns (arm -> seed -> held-out figures at each evaluation, the runs' records)."""
    runs = {f"{arm}-s{seed}": (a.work / f"{arm}-s{seed}", seed, a.steps, flags) for seed in a.seeds
            for arm, flags in arms.items()}
    records = rl_runs(runs, model, a, label, lambda name, out: held_out(evals(out)))
    print("\n" + table(records, a.parallel))
    exit_if_failed(records)
    return {arm: {seed: evals(a.work / f"{arm}-s{seed}") for seed in a.seeds} for arm in arms}, records


def fields(a: argparse.Namespace, records: list[dict]) -> dict:
    """What every A/B result holds besides its figures: machine, date, commit, the device and the
    runs' concurrency, the base model, and each run's record with the wall time over them."""
    return {**stamp(a.device), "parallel": a.parallel, "model": a.model, "steps": a.steps, "wall": span(records),
            "run_records": records}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for arm, color in zip(results, [f"C{i}" for i in range(10)]):
        for i, (seed, rows) in enumerate(sorted(results[arm].items())):
            steps = [r["step"] for r in rows]
            kw = {"color": color, "alpha": 0.8, "label": arm if i == 0 else None}
            axes[0].plot(steps, [r["tool_error_rate"] for r in rows], **kw)
            axes[1].plot(steps, [r["reward"] for r in rows], **kw)
    axes[0].set(xlabel="step", ylabel="held-out tool-error rate", title="failed calls / calls")
    axes[1].set(xlabel="step", ylabel="held-out reward", title="tool-calc")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)

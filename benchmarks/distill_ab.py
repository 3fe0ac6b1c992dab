"""A/B: GRPO alone against GRPO + hint self-distillation, on tool-calc, same everything else.

    uv run python benchmarks/distill_ab.py [--seeds 0,1,2] [--steps 20] [--arms grpo+distill,...]
                                           [--results DIR] [--work DIR]

Both arms start from one warm-started tiny model (tool-calc demonstrations with deliberate
wrong calls, `tool_calc.demos`, then `uv run sft`), and run `rl @ configs/tool-calc-distill.toml`
with the same seed, step budget, batch (32 rollouts, groups of 8), lr and held-out set (32
questions x 2 samples at fixed seeds, every 5 steps). Operands are two-digit (max_operand 99):
the 1M-parameter model cannot copy three-digit numbers reliably, and with no correct answers
GRPO would have no signal at all. The only difference: the distill arm
turns on `orchestrator.distill` and trains the `distill` channel at weight 0.1 next to `rl`
(chosen on seed 0: at weight 1 the policy collapsed by step 7, with the whole turn or the
first-miss scope; the frozen teacher at weight 1 ended worse than GRPO alone; at 0.1 it still
collapsed on seeds 3 and 4 of 0-5). Two more arms can be run against the same GRPO runs: the
sampled-token estimator (`grpo+distill-sampled`, weight `--sampled-weight`), a control
with every distill step on but weight 0 (`grpo+distill-w0`), and the A/B arm with the teacher
scored by an EMA of the policy (`grpo+distill-ema`) or by the initial weights
(`grpo+distill-frozen`); `--distill-flags` adds flags to the distill arms. A finished run is
reused only when its recorded command is the same.

Records per arm and seed the held-out tool-error rate (failed calls / calls) and reward at every
evaluation. Target: the distill arm's held-out tool-error rate at the end of the budget is at
most half of GRPO's. Writes <results>/distill_ab.json and distill_ab.png (default
benchmarks/results); the warm start and the runs live under <work> (default outputs/distill-ab).
`--sft-steps`, `--demos` and `--rl-flags` (added to every arm) exist to run it small.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from composer_prime.utils.logs import setup  # noqa: E402
from composer_prime.utils.net import free_port  # noqa: E402
from composer_prime.utils.progress import Progress  # noqa: E402
ENVS = ('[{id = "tool-calc", max_turns = 3, args = {max_operand = 99}, '
        'eval_args = {split = "eval", num_tasks = 200, max_operand = 99}}]')
DISTILL_ON = ["--orchestrator.distill.enabled", "true"]
# The baseline and the distill arms; each distill arm differs from "grpo" only in its own flags.
ARMS = {"grpo": ["--orchestrator.distill.enabled", "false", "--trainer.loss.weights", "{rl = 1.0}"],
        "grpo+distill": [*DISTILL_ON, "--trainer.loss.distill.teacher", "current", "--trainer.loss.weights", "{rl = 1.0, distill = 0.1}"],
        "grpo+distill-w0": [*DISTILL_ON, "--trainer.loss.weights", "{rl = 1.0, distill = 0.0}"],
        "grpo+distill-ema": [*DISTILL_ON, "--trainer.loss.distill.teacher", "ema", "--trainer.loss.weights", "{rl = 1.0, distill = 0.1}"],
        "grpo+distill-frozen": [*DISTILL_ON, "--trainer.loss.distill.teacher", "frozen", "--trainer.loss.weights", "{rl = 1.0, distill = 0.1}"],
        "grpo+distill-sampled": [*DISTILL_ON, "--trainer.loss.distill.estimator", "sampled",
                                 "--trainer.loss.weights", "{rl = 1.0, distill = WEIGHT}"]}
BASELINE = "grpo"


def run(cmd: list[str], log: Path) -> None:
    with log.open("w") as f:
        if subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)} (log: {log})")


def warm_start(out: Path, n_demos: int, sft_steps: int, name: str = "agent", base: str = "tiny",
               error_rate: float = 0.5) -> Path:
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
         "--output_dir", str(agent), "--max_steps", str(sft_steps), "--batch_size", "16", "--lr", "1e-3", "--warmup_steps", "20"],
        out / f"{name}-sft.log")
    return agent


def arm_flags(arm: str, a: argparse.Namespace) -> list[str]:
    extra = a.distill_flags.split() if arm != BASELINE else []
    return [f.replace("WEIGHT", str(a.sampled_weight)) for f in ARMS[arm]] + extra + a.rl_flags.split()


def finished(run_dir: Path, args: list[str]) -> bool:
    """A run is reused when it ended (`rl` writes summary.json last) with these very arguments."""
    done, recorded = run_dir / "summary.json", run_dir / "ab-command.json"
    return done.exists() and recorded.exists() and json.loads(recorded.read_text()) == args


def evals(run_dir: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (run_dir / "orchestrator" / "metrics.jsonl").read_text().splitlines()]
    return [{"step": r["step"], "tool_error_rate": r["eval/tool-calc/tool_error_rate"], "reward": r["eval_reward"],
             "tool_calls": r["eval/tool-calc/tool_calls"]} for r in rows if "eval_reward" in r]


def summarise(results: dict) -> dict:
    """Per arm: mean start and final held-out figures; per distill arm: its final tool-error
    rate over GRPO's and whether that is at most half with no collapsed seed (the target)."""
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    out = {}
    for arm, runs in results.items():
        final = [runs[s][-1] for s in sorted(runs)]
        out[arm] = {"final_tool_error_rate": mean([r["tool_error_rate"] for r in final]),
                    "final_reward": mean([r["reward"] for r in final]),
                    "start_tool_error_rate": mean([runs[s][0]["tool_error_rate"] for s in runs]),
                    # nothing solved at the end: a policy that stopped calling tools has no tool
                    # errors either, so the rate alone would score it perfect
                    "collapsed_seeds": sorted(s for s in runs if runs[s][-1]["reward"] == 0.0)}
    g = out[BASELINE]["final_tool_error_rate"]
    for arm in results:
        if arm != BASELINE:
            d = out[arm]["final_tool_error_rate"]
            out[arm] |= {"ratio_over_grpo": d / g if g else None,
                         "target_met": bool(g) and d <= 0.5 * g and not out[arm]["collapsed_seeds"]}
    return out


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--arms", default="grpo+distill", help=f"from {', '.join(ARMS)} (grpo is always run)")
    p.add_argument("--sampled-weight", type=float, default=0.1, help="distill weight of the sampled-estimator arm")
    p.add_argument("--distill-flags", default="", help="extra rl flags for the distill arms, e.g. '--trainer.loss.distill.clamp 1'")
    p.add_argument("--rl-flags", default="", help="extra rl flags for every arm, e.g. '--orchestrator.eval.num_tasks 8'")
    p.add_argument("--sft-steps", type=int, default=800, help="SFT steps of the warm start")
    p.add_argument("--demos", type=int, default=4000, help="demonstrations the warm start learns from")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "distill-ab")
    a = p.parse_args()
    setup("distill_ab", stderr=True)  # the progress lines; the table goes to stdout
    arms = [BASELINE] + [x for x in a.arms.split(",") if x != BASELINE]
    if unknown := [x for x in arms if x not in ARMS]:
        sys.exit(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
    work = a.work.resolve()
    agent = warm_start(work, a.demos, a.sft_steps)
    results: dict = {arm: {} for arm in arms}
    seeds = [int(s) for s in a.seeds.split(",")]
    with Progress("distill_ab", len(seeds) * len(arms), "runs") as progress:
        for seed in seeds:
            for arm in arms:
                flags = arm_flags(arm, a)
                run_dir = work / f"{arm}-s{seed}"
                t0 = time.time()
                cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/tool-calc-distill.toml",
                       "--model", str(agent), "--output_dir", str(run_dir), "--seed", str(seed), "--max_steps", str(a.steps),
                       "--orchestrator.envs", ENVS, *flags]
                if not finished(run_dir, cmd[3:]):
                    run(cmd + ["--inference.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}"],
                        work / f"{arm}-s{seed}.log")
                    (run_dir / "ab-command.json").write_text(json.dumps(cmd[3:]))
                results[arm][seed] = evals(run_dir)
                last = results[arm][seed][-1]
                progress.echo(f"{arm:20s} seed {seed}: held-out tool-error rate {results[arm][seed][0]['tool_error_rate']:.3f} "
                              f"-> {last['tool_error_rate']:.3f}, reward {last['reward']:.3f} ({time.time() - t0:.0f}s)", file=sys.stdout)
                progress.advance()
    summary = summarise(results)
    print(f"\n| arm | held-out tool-error rate, start -> end (mean of {len(results[BASELINE])} seeds) "
          "| held-out reward at end | collapsed seeds | over GRPO (target <= 0.5) |")
    print("|---|---|---|---|---|")
    for arm in arms:
        s = summary[arm]
        ratio = "" if arm == BASELINE else ("n/a" if s["ratio_over_grpo"] is None else
                                            f"{s['ratio_over_grpo']:.2f} ({'met' if s['target_met'] else 'not met'})")
        print(f"| {arm} | {s['start_tool_error_rate']:.3f} -> {s['final_tool_error_rate']:.3f} | {s['final_reward']:.3f} "
              f"| {','.join(map(str, s['collapsed_seeds'])) or '-'} | {ratio} |")
    a.results.mkdir(parents=True, exist_ok=True)
    settings = {arm: arm_flags(arm, a) for arm in arms}
    (a.results / "distill_ab.json").write_text(json.dumps({"steps": a.steps, "arms": settings, "runs": results,
                                                           "summary": summary}, indent=1))
    plot(results, a.results / "distill_ab.png")
    print(f"wrote {a.results / 'distill_ab.json'} and distill_ab.png")


if __name__ == "__main__":
    main()

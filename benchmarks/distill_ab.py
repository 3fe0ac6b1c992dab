"""A/B: GRPO alone against GRPO + hint self-distillation, on tool-calc, same everything else.

    uv run python benchmarks/distill_ab.py [--seeds 0,1,2] [--steps 20] [--arms grpo+distill,...]
                                           [--device cpu|cuda] [--parallel N] [--model tiny]
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
benchmarks/results; with machine, date, commit and each run's wall time, start and end); the warm
start and the runs live under <work> (default outputs/distill-ab, or distill-ab-<model>).
`--sft-steps`, `--demos` and `--rl-flags` (added to every arm) exist to run it small.

`--parallel N` runs N of the arm x seed runs at once, each with its own ports, directory and log
(support/runs.py); `--device cuda` puts them all on one GPU (support/cli.py: bfloat16 as
configs/smollm2-135m-gpu.toml, vLLM's memory shared out). `--model` is the warm start's base (e.g.
smollm2-135m; `--sft-lr` its SFT learning rate; the rl one is the config's, or `--rl-flags`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from composer_prime.utils.logs import setup  # noqa: E402
# (openenv.py takes ROOT and warm_start from here; this script's folder is on sys.path)
from support.ab import ROOT, add_ab_args, arms_x_seeds, check_ab_args, fields, plot, run, warm_start  # noqa: E402
from support.cli import Parser, device_env  # noqa: E402

DISTILL_ON = ["--orchestrator.distill.enabled", "true"]
# The baseline and the distill arms; each distill arm differs from "grpo" only in its own flags.
ARMS = {"grpo": ["--orchestrator.distill.enabled", "false", "--trainer.loss.weights", "{rl = 1.0}"],
        "grpo+distill": [*DISTILL_ON, "--trainer.loss.distill.teacher", "current", "--trainer.loss.weights", "{rl = 1.0, distill = 0.1}"],
        "grpo+distill-w0": [*DISTILL_ON, "--trainer.loss.weights", "{rl = 1.0, distill = 0.0}"],
        "grpo+distill-ema": [*DISTILL_ON, "--trainer.loss.distill.teacher", "ema", "--trainer.loss.weights", "{rl = 1.0, distill = 0.1}"],
        "grpo+distill-frozen": [*DISTILL_ON, "--trainer.loss.distill.teacher", "frozen", "--trainer.loss.weights", "{rl = 1.0, distill = 0.1}"],
        "grpo+distill-sampled": [*DISTILL_ON, "--trainer.loss.distill.estimator", "sampled",
                                 "--trainer.loss.weights", "{rl = 1.0, distill = WEIGHT}"]}
# The issue-45 arms: the real hint, placebos (its words shuffled; another error kind's hint; a sentence saying nothing)
# and an oracle (the correct turn),
# the same channel otherwise: the EMA teacher, the collapse guard (the default), HINT_WEIGHT and the gate.
HINT = [*DISTILL_ON, "--trainer.loss.distill.teacher", "ema", "--trainer.loss.weights", "{rl = 1.0, distill = HINT_WEIGHT}"]
ARMS |= {"grpo+hint": HINT, "grpo+placebo": [*HINT, "--orchestrator.distill.hints.placebo", "shuffle"],
         "grpo+placebo-other": [*HINT, "--orchestrator.distill.hints.placebo", "other_kind"],
         "grpo+placebo-blank": [*HINT, "--orchestrator.distill.hints.placebo", "blank"],
         "grpo+oracle": [*HINT, "--orchestrator.distill.hints.sources", '["oracle", "env", "template"]'],
         # RLSD: the hinted current policy only scales rl's advantage per token (within 1 +- credit_clip)
         "grpo+credit": [*DISTILL_ON, "--trainer.loss.distill.estimator", "credit", "--trainer.loss.distill.teacher", "current",
                         "--trainer.loss.weights", "{rl = 1.0, distill = 1.0}"]}
ARMS["grpo+credit-centred"] = [*ARMS["grpo+credit"], "--trainer.loss.distill.credit_center", "true"]  # the hint's shift removed
BASELINE = "grpo"
PLACEBOS = ("grpo+placebo", "grpo+placebo-other", "grpo+placebo-blank")


def arm_flags(arm: str, a: argparse.Namespace) -> list[str]:
    extra = a.distill_flags.split() if arm != BASELINE else []
    if arm in ("grpo+hint", *PLACEBOS, "grpo+oracle", "grpo+credit", "grpo+credit-centred") and a.gate:  # every arm gated by the real hint's lift
        extra += ["--orchestrator.distill.gate.enabled", "true", "--orchestrator.distill.gate.lift_file", str(a.gate.resolve())]
    flags = [f.replace("HINT_WEIGHT", str(a.hint_weight)).replace("WEIGHT", str(a.sampled_weight)) for f in ARMS[arm]]
    return flags + extra + a.rl_flags.split()


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
                         "target_met": bool(g) and d <= 0.5 * g and not out[arm]["collapsed_seeds"],
                         "reward_not_below_grpo": out[arm]["final_reward"] >= out[BASELINE]["final_reward"]}
    return out | controls(out)


def controls(out: dict) -> dict:
    """Issue 45's checks of the control arms, where they ran: the placebo is not better than GRPO
    (its tool-error rate not lower), the oracle at least as good as the real hint (rate not higher,
    reward not lower)."""
    checks = {}
    for arm in (a for a in PLACEBOS if a in out):
        p, g = out[arm], out[BASELINE]
        checks[f"{arm.removeprefix('grpo+')}_not_better_than_grpo"] = p["final_tool_error_rate"] >= g["final_tool_error_rate"]
    if "grpo+oracle" in out and "grpo+hint" in out:
        o, h = out["grpo+oracle"], out["grpo+hint"]
        checks["oracle_at_least_real"] = (o["final_tool_error_rate"] <= h["final_tool_error_rate"]
                                          and o["final_reward"] >= h["final_reward"])
    return {"checks": checks} if checks else {}


def main() -> None:
    p = Parser(description=__doc__.splitlines()[0])
    add_ab_args(p)
    p.add_argument("--arms", default="grpo+distill", help=f"from {', '.join(ARMS)} (grpo is always run)")
    p.add_argument("--sampled-weight", type=float, default=0.1, help="distill weight of the sampled-estimator arm")
    p.add_argument("--out-name", default="distill_ab", help="the result's name: <results>/<name>.json and .png")
    p.add_argument("--hint-weight", type=float, default=1.0, help="distill weight of the hint, placebo and oracle arms")
    p.add_argument("--gate", type=Path, help="a benchmarks/hint_lift.py result: the hint, placebo and oracle arms "
                                             "distill only error kinds whose lift lies above 0 there ('auto': "
                                             "measure it on the warm start first, on --device)")
    p.add_argument("--distill-flags", default="", help="extra rl flags for the distill arms, e.g. '--trainer.loss.distill.clamp 1'")
    a = p.parse_args()
    arms = [BASELINE] + [x for x in a.arms.split(",") if x != BASELINE]
    if unknown := [x for x in arms if x not in ARMS]:
        p.error(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
    check_ab_args(p, a, "distill_ab")
    setup("distill_ab", stderr=True)  # the progress lines; the tables go to stdout
    agent = warm_start(a.work, a.demos, a.sft_steps, base=a.model, lr=a.sft_lr, env=device_env(a.device))
    if a.gate == Path("auto"):  # the warm start's own hint lift, measured before any arm runs
        name = Path(a.model).name
        run([sys.executable, str(ROOT / "benchmarks" / "hint_lift.py"), "--model", str(agent), "--name", name,
             "--device", a.device, "--results", str(a.results)], a.work / "hint-lift.log", device_env(a.device))
        a.gate = a.results / f"hint_lift_{name}.json"
    settings = {arm: arm_flags(arm, a) for arm in arms}
    results, records = arms_x_seeds(settings, agent, a, "distill_ab")
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
    for name, ok in summary.get("checks", {}).items():
        print(f"{name}: {'yes' if ok else 'no'}")
    a.results.mkdir(parents=True, exist_ok=True)
    (a.results / f"{a.out_name}.json").write_text(json.dumps({**fields(a, records), "arms": settings, "runs": results,
                                                              "summary": summary}, indent=1))
    plot(results, a.results / f"{a.out_name}.png")
    print(f"wrote {a.results / a.out_name}.json and .png")


if __name__ == "__main__":
    main()

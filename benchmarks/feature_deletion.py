"""Feature Deletion task generation on real PyPI sdists: how long it takes, how much it yields.

    uv run python benchmarks/feature_deletion.py [--sources pypi:inflection==0.5.1,pypi:toolz==1.0.0]
                                                 [--jobs 1] [--max-tasks N]

For each source (downloaded once with pip into ~/.cache/composer-prime/sdists), builds a task
set with seed 0 and times it: the two baseline runs, the coverage run (one context per test),
the gates (one full-suite run on the broken tree plus one run of the task's tests on the
restored tree, per candidate). Then scores
each accepted task twice in its sandbox: the untouched broken repo (expect reward 0) and the
repo with solution/ copied over it (expect reward 1), and times both.
Prints a table and writes benchmarks/results/feature_deletion.json.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# This file's own name would shadow the `feature_deletion` package: drop its directory from the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
sys.path.insert(0, str(ROOT))

from feature_deletion.generate import build  # noqa: E402
from feature_deletion.scoring import score_task  # noqa: E402


def arg(name: str, default: str | None) -> str | None:
    args = sys.argv[1:]
    return args[args.index(name) + 1] if name in args else default


def time_scoring(set_dir: Path, tasks: list[dict]) -> list[dict]:
    rows = []
    for t in tasks:
        d = set_dir / "tasks" / t["id"]
        with tempfile.TemporaryDirectory(prefix="fd-bench-") as tmp:
            fixed = Path(tmp) / "fixed"
            shutil.copytree(d / "repo", fixed)
            shutil.copytree(d / "solution", fixed, dirs_exist_ok=True)
            row = {"id": t["id"], "n_tests": t["n_tests"]}
            for name, repo in (("broken", d / "repo"), ("restored", fixed)):
                start = time.perf_counter()
                score = score_task(d, repo)
                row[f"{name}_s"] = round(time.perf_counter() - start, 3)
                row[f"{name}_reward"] = score.reward
        print(f"  scored {t['id']}: broken {row['broken_reward']} in {row['broken_s']} s, "
              f"restored {row['restored_reward']} in {row['restored_s']} s", flush=True)
        rows.append(row)
    return rows


def bench(source: str, jobs: int, max_tasks: int | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="fd-bench-") as tmp:
        out = Path(tmp) / "set"
        start = time.perf_counter()
        m = build(source, out, seed=0, max_tasks=max_tasks, jobs=jobs, log=lambda msg: print("  " + msg, flush=True))
        wall = time.perf_counter() - start
        r = m["report"]
        row = {"source": source, "sha256": m["source"]["sha256"], "jobs": jobs, "max_tasks": max_tasks,
               "tests": r["tests_collected"], "stable_passing": r["tests_stable_passing"],
               "functions": r["candidates"], "passed_filters": r["passed_filters"], "evaluated": r["evaluated"],
               "accepted": r["accepted"], "rejected": r["rejected"], "seconds": r["seconds"],
               "wall_s": round(wall, 3),
               "gates_s_per_candidate": round(r["seconds"]["gates"] / max(1, r["evaluated"]), 3),
               "total_s_per_accepted": round(r["seconds"]["total"] / max(1, r["accepted"]), 3),
               "tasks": [t["id"] for t in m["tasks"]]}
        rows = time_scoring(out, m["tasks"])
        row["scoring"] = rows
        row["scoring_mean_s"] = {k: round(sum(x[k] for x in rows) / len(rows), 3) for k in ("broken_s", "restored_s")}
        row["scoring_rewards_ok"] = all(x["broken_reward"] == 0 and x["restored_reward"] == 1 for x in rows)
        return row


def main() -> None:
    sources = arg("--sources", "pypi:inflection==0.5.1,pypi:toolz==1.0.0").split(",")
    jobs = int(arg("--jobs", "1"))
    max_tasks = int(arg("--max-tasks", "0")) or None
    results = []
    for source in sources:
        print(f"building from {source}", flush=True)
        results.append(bench(source, jobs, max_tasks))
    out = Path(arg("--results", str(ROOT / "benchmarks" / "results"))) / "feature_deletion.json"  # --results DIR: elsewhere
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": f"cores={os.cpu_count()}", "python": sys.version.split()[0],
                               "results": results}, indent=2) + "\n")
    print("\n| source | tests | functions | passed filters | accepted | baseline | coverage | gates "
          "| total | gates / candidate | total / accepted task |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        s = r["seconds"]
        print(f"| {r['source']} | {r['tests']} | {r['functions']} | {r['passed_filters']} | {r['accepted']} "
              f"| {s['baseline']:.1f} s | {s['coverage']:.1f} s | {s['gates']:.1f} s | {s['total']:.1f} s "
              f"| {r['gates_s_per_candidate']:.1f} s | {r['total_s_per_accepted']:.1f} s |")
    print("\n| source | rejected |\n|---|---|")
    for r in results:
        print(f"| {r['source']} | {', '.join(f'{k} {v}' for k, v in r['rejected'].items())} |")
    print("\n| source | tasks scored | broken: mean s | restored: mean s | rewards 0 then 1 |\n|---|---|---|---|---|")
    for r in results:
        print(f"| {r['source']} | {len(r['scoring'])} | {r['scoring_mean_s']['broken_s']} s "
              f"| {r['scoring_mean_s']['restored_s']} s | {r['scoring_rewards_ok']} |")
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()

"""Feature Deletion at scale on real PyPI projects: one task set built from a list of sources,
every accepted task checked in the sandbox, a sample of every source audited by the red team.

    uv run python benchmarks/feature_deletion.py [--sources benchmarks/feature_deletion_sources.txt]
        [--work outputs/bench/feature-deletion] [--results benchmarks/results] [--max-tasks 5] [--jobs N]
        [--retry-failed] [--skip-redteam] [--attacks a,b,...]

The build is `composer-prime env build-tasks --sources` (feature_deletion.sources: parallel within
the cores, resumable: rerunning after a crash keeps finished sources). Per source: tests
collected and stable, functions considered, tasks accepted, rejections by reason, build time
(test environment, baseline, coverage, gates). Then every accepted task is scored twice by
`score_task` in its sandbox: the untouched broken repo must score 0 and the repo with solution/
copied in exactly 1.0. Then the red team (feature_deletion.redteam) on one task of every source.
`--attacks` limits the red team to those attacks (default: all; the three that wait for a
limit, fork_bomb, memory_hog and infinite_loop, cost a scoring timeout each).
Writes <results>/feature_deletion.json and prints the tables of benchmarks/README.md#feature_deletion.
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

from composer_prime.utils.logs import setup  # noqa: E402
from composer_prime.utils.progress import Progress  # noqa: E402
from feature_deletion.candidates import Settings  # noqa: E402
from feature_deletion.redteam import audit, summary  # noqa: E402
from feature_deletion.scoring import score_task  # noqa: E402
from feature_deletion.sources import build_many, parse_sources  # noqa: E402


def arg(name: str, default: str | None) -> str | None:
    args = sys.argv[1:]
    return args[args.index(name) + 1] if name in args else default


def check_task(task_dir: Path) -> dict:
    """The broken repo's reward and the restored one's, from the scorer, with their times."""
    row = {"id": task_dir.name}
    with tempfile.TemporaryDirectory(prefix="fd-bench-") as tmp:
        fixed = Path(tmp) / "fixed"
        shutil.copytree(task_dir / "repo", fixed)
        shutil.copytree(task_dir / "solution", fixed, dirs_exist_ok=True)
        for name, repo in (("broken", task_dir / "repo"), ("restored", fixed)):
            start = time.perf_counter()
            row[f"{name}_reward"] = score_task(task_dir, repo).reward
            row[f"{name}_s"] = round(time.perf_counter() - start, 3)
    return row


def source_row(root: Path, entry: dict, progress: Progress) -> dict:
    row = {"source": entry["source"], "status": entry["status"], "error": entry.get("error")}
    if entry["status"] != "ok":
        return row
    m = json.loads((root / entry["dir"] / "manifest.json").read_text())
    r = m["report"]
    checks = []
    for t in m["tasks"]:
        checks.append(check_task(root / entry["dir"] / "tasks" / t["id"]))
        c = checks[-1]
        progress.echo(f"  scored {entry['slug']}/{c['id']}: broken {c['broken_reward']} ({c['broken_s']} s), "
                      f"restored {c['restored_reward']} ({c['restored_s']} s)", file=sys.stdout)
        progress.advance()
    return {**row, "tests": r["tests_collected"], "stable_passing": r["tests_stable_passing"],
            "functions": r["candidates"], "passed_filters": r["passed_filters"], "evaluated": r["evaluated"],
            "accepted": r["accepted"], "rejected": r["rejected"], "gate_rejections": r["gate_rejections"],
            "seconds": r["seconds"], "installed": len(m["testenv"]["installed"]),
            "requirements": m["testenv"]["requirements"], "plugins": sorted(m["testenv"]["plugins"]),
            "checks": checks, "checks_ok": sum(c["broken_reward"] == 0.0 and c["restored_reward"] == 1.0 for c in checks)}


def main() -> None:
    setup("feature_deletion", stderr=True)  # the progress lines; the tables go to stdout
    sources = parse_sources(Path(arg("--sources", str(ROOT / "benchmarks" / "feature_deletion_sources.txt"))))
    out = Path(arg("--work", str(ROOT / "outputs" / "bench" / "feature-deletion")))
    max_tasks = int(arg("--max-tasks", "5"))
    jobs = int(arg("--jobs", "0")) or None
    start = time.perf_counter()
    # no live line for the build: its worker processes write to this terminal
    with Progress("build", None, "sources", live=False) as progress:
        index = build_many(sources, out, seed=0, max_tasks=max_tasks, jobs=jobs, settings=Settings(),
                           retry_failed="--retry-failed" in sys.argv, log=progress.echo, progress=progress.update)
    build_s = time.perf_counter() - start
    with Progress("sandbox checks", len(index["tasks"]), "tasks") as progress:
        rows = [source_row(out, e, progress) for e in index["sources"]]
    red = None
    if "--skip-redteam" not in sys.argv:
        attacks = arg("--attacks", None)
        with Progress("red team", None, "attacks") as progress:
            red = summary(audit(out, n=len([r for r in rows if r["status"] == "ok"]),
                                attacks=attacks.split(",") if attacks else None,
                                log=lambda m: progress.echo(m, file=sys.stdout), progress=progress.update))
    result = {"machine": f"cores={os.cpu_count()}", "python": sys.version.split()[0], "max_tasks": max_tasks,
              "attacks": arg("--attacks", "all"),
              "build_wall_s": round(build_s, 1), "sources": rows, "redteam": red}
    path = Path(arg("--results", str(ROOT / "benchmarks" / "results"))) / "feature_deletion.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print_tables(result)
    print(f"\nwritten {path}")


def print_tables(result: dict) -> None:
    print("\n| source | tests (stable) | functions | passed filters | accepted | rejected | env / baseline / coverage / gates "
          "| sandbox check (0 broken, 1.0 restored) |\n|---|---|---|---|---|---|---|---|")
    for r in result["sources"]:
        if r["status"] != "ok":
            print(f"| {r['source']} | {r['status']}: {r['error']} |  |  |  |  |  |  |")
            continue
        s = r["seconds"]
        rej = ", ".join(f"{k} {v}" for k, v in r["rejected"].items())
        print(f"| {r['source'][5:]} | {r['tests']} ({r['stable_passing']}) | {r['functions']} | {r['passed_filters']} "
              f"| {r['accepted']} | {rej} | {s['testenv']:.0f} / {s['baseline']:.0f} / {s['coverage']:.0f} / {s['gates']:.0f} s "
              f"| {r['checks_ok']}/{len(r['checks'])} |")
    red = result["redteam"]
    if red:
        print(f"\nred team: {red['attacks']} attacks on {red['tasks']} tasks, {red['failures']} failures")
        for x in red["results"]:
            if not x["ok"]:
                print(f"  {x['task']} {x['attack']}: {x['problem']}")


if __name__ == "__main__":
    main()

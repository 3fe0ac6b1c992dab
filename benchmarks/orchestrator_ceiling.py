"""The orchestrator's ceiling: rollouts/s that the orchestrator and the inference server sustain
when generating costs nothing, end to end and split by component, before and after a change.

    uv run python benchmarks/orchestrator_ceiling.py [--steps 30] [--repeats 3] [--batch 128]
                                                     [--baseline COMMIT] [--results DIR] [--work DIR]

The engine answers every request at once (benchmarks/support/instant.py: a real engine class
injected into the real inference server, its own process as in `rl`); the orchestrator runs its
own steps at the quickstart's settings (configs/quickstart.toml: reverse-text, batch 128, groups
of 8, 16 tokens, seq_len 128) and sends each batch over ZMQ to a sink process standing where the
trainer does (benchmarks/support/ceiling.py says what a step and each component are). So what is
measured is the per-request and per-rollout work around the model: HTTP, the chat template,
scoring, advantages, packing, the ZMQ send.

With `--baseline COMMIT` the same measurement also runs on that commit's code (`git archive` into
<work>, put first on the import path of the orchestrator and of the server), the two taking turns
within every repeat so that a change in the machine's speed falls on both. Besides wall time, the
CPU time the orchestrator and the server used per rollout over the timed steps: a machine loaded by
other work stretches the first far more than the second. Prints a table and writes
<results>/orchestrator_ceiling.json (default benchmarks/results): every run, and per code the
median and range of rollouts/s, of each component's microseconds per rollout and of the CPU
times; stamped with the machine, date and commit (and whether the measured code had changed since).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from support.ceiling import COMPONENTS  # noqa: E402
from support.heldout import healthy  # noqa: E402
from support.spread import spread  # noqa: E402

from composer_prime.utils.logs import setup  # noqa: E402
from composer_prime.utils.net import free_port  # noqa: E402
from composer_prime.utils.proc import die_with_parent  # noqa: E402
from composer_prime.utils.progress import Progress  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SUPPORT = Path(__file__).resolve().parent / "support"
QUICKSTART_CPU = 177.9  # rollouts/s, the embedded engine's quickstart on the 2-core CPU (benchmarks/README.md)
TARGET = 10 * QUICKSTART_CPU
MEASURED = ("composer_prime/orchestrator", "composer_prime/inference", "composer_prime/contract", "composer_prime/utils",
            "composer_prime/env_runtime", "composer_prime/transports", "benchmarks/support/ceiling.py",
            "benchmarks/support/instant.py")  # the code a measurement runs


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def checkout(commit: str, work: Path) -> Path:
    """`commit`'s tree under <work>/baseline-<sha> (read-only use of the repository: git archive)."""
    sha = git("rev-parse", "--short", commit)
    tree = work / f"baseline-{sha}"
    if not (tree / "composer_prime").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", sha, "composer_prime"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def start(cmd: list[str], log: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                            preexec_fn=die_with_parent(signal.SIGTERM))


def one(code: Path | None, a: argparse.Namespace, work: Path) -> dict:
    """One measurement: a server and a sink started for it, the orchestrator in a process of its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code)] * (code is not None) + [os.environ.get("PYTHONPATH", "")])}
    port, address = free_port(), f"tcp://127.0.0.1:{free_port()}"
    url = f"http://127.0.0.1:{port}"
    work.mkdir(parents=True, exist_ok=True)
    procs = [start([sys.executable, str(SUPPORT / "instant.py"), "serve", "--port", str(port)], work / "serve.log", env),
             start([sys.executable, str(SUPPORT / "instant.py"), "sink", "--address", address], work / "sink.log", env)]
    try:
        deadline = time.time() + 300
        while not healthy(url):
            if procs[0].poll() is not None or time.time() > deadline:
                sys.exit(f"the instant server did not start (log: {work / 'serve.log'})")
            time.sleep(0.3)
        cmd = [sys.executable, str(SUPPORT / "ceiling.py"), url, address,
               *map(str, (procs[0].pid, a.batch, a.group, a.max_tokens, a.steps)),
               str(work)]
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
        if out.returncode != 0:
            sys.exit(f"the measurement failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)


def stamp() -> dict:
    return {"machine": f"{platform.machine()} cores={os.cpu_count()}", "python": platform.python_version(),
            "date": datetime.date.today().isoformat(), "commit": git("rev-parse", "--short", "HEAD"),
            "changed_since_commit": bool(git("status", "--porcelain", "--", *MEASURED))}


def summarise(runs: list[dict]) -> dict:
    return {"rollouts_per_s": spread([r["rollouts_per_s"] for r in runs], 1),
            "requests_per_step": spread([r["requests_per_step"] for r in runs], 1),
            "us_per_rollout": {k: spread([r["us_per_rollout"][k] for r in runs], 1) for k in (*COMPONENTS, "other")},
            "us_per_rollout_total": spread([1e6 / r["rollouts_per_s"] for r in runs], 1),
            "cpu_us_per_rollout": {k: spread([r["cpu_us_per_rollout"][k] for r in runs], 1) for k in ("orchestrator", "server")}}


def table(result: dict) -> str:
    codes = list(result["summary"])
    fmt = lambda s: f"{s['median']} [{s['min']}, {s['max']}]"  # noqa: E731
    rows = [f"| per rollout | {' | '.join(codes)} |", "|---|" + "---|" * len(codes)]
    rows.append("| **rollouts/s** | " + " | ".join(fmt(result["summary"][c]["rollouts_per_s"]) for c in codes) + " |")
    rows.append("| total µs | " + " | ".join(fmt(result["summary"][c]["us_per_rollout_total"]) for c in codes) + " |")
    for k in (*COMPONENTS, "other"):
        rows.append(f"| {k} µs | " + " | ".join(fmt(result["summary"][c]["us_per_rollout"][k]) for c in codes) + " |")
    for k in ("orchestrator", "server"):
        rows.append(f"| {k} CPU µs | " + " | ".join(fmt(result["summary"][c]["cpu_us_per_rollout"][k]) for c in codes) + " |")
    rows.append("| requests per step | " + " | ".join(fmt(result["summary"][c]["requests_per_step"]) for c in codes) + " |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="timed steps per measurement (after 2 untimed)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=128, help="rollouts per step")
    p.add_argument("--group", type=int, default=8, help="rollouts per group")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--baseline", help="also measure this commit's code (e.g. HEAD, before uncommitted changes)")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-orchestrator-ceiling")
    a = p.parse_args()
    if a.steps < 1 or a.repeats < 1 or a.batch < a.group or a.batch % a.group:
        p.error("--steps and --repeats must be at least 1, --batch a multiple of --group")
    setup("orchestrator_ceiling", stderr=True)  # the progress lines; the table goes to stdout
    work = a.work.resolve()
    codes: dict[str, Path | None] = {}
    if a.baseline:
        codes[f"baseline {git('rev-parse', '--short', a.baseline)}"] = checkout(a.baseline, work)
    codes["current"] = None
    runs = []
    with Progress("orchestrator_ceiling", total=a.repeats * len(codes), unit="runs") as progress:
        for i in range(a.repeats):
            for name in (list(codes) if i % 2 == 0 else list(reversed(codes))):  # the order alternating
                runs.append({"code": name, "repeat": i, **one(codes[name], a, work / f"{name.split()[0]}-{i}")})
                progress.advance(1, note=f"{name} {runs[-1]['rollouts_per_s']:.0f} rollouts/s")
    summary = {name: summarise([r for r in runs if r["code"] == name]) for name in codes}
    result = {**stamp(), "settings": {"steps": a.steps, "batch": a.batch, "group": a.group, "max_tokens": a.max_tokens,
                                      "seq_len": 128, "env": "reverse-text"},
              "repeats": a.repeats, "target_rollouts_per_s": TARGET,
              "target_met": summary["current"]["rollouts_per_s"]["median"] >= TARGET, "summary": summary, "runs": runs}
    a.results.mkdir(parents=True, exist_ok=True)
    out = a.results / "orchestrator_ceiling.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"\n{table(result)}\n\nmedian [range] over {a.repeats} repeats of {a.steps} steps of {a.batch}; {result['machine']}, "
          f"{result['date']}, commit {result['commit']}{' (with uncommitted changes)' * result['changed_since_commit']}; "
          f"target {TARGET:.0f} rollouts/s: {'met' if result['target_met'] else 'not met'}\n\nwritten {out}")


if __name__ == "__main__":
    main()

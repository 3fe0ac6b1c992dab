"""DiLoCo islands: bytes between islands, held-out reward against one island, and sync time over a slow link.

    uv run python benchmarks/diloco.py [--steps 32] [--seeds 0,1] [--link 25,100] [--sync-every 1,8,32]
        [--fragments 1,2,4] [--parts bytes,reward,link] [--results DIR] [--work DIR]

Every figure comes from real `rl` runs of the quickstart (tiny model, reverse-text) with two
islands on this machine (`@ configs/diloco.toml`), read from the islands' trainer metrics:

- bytes: each island's outer-gradient payload per trainer step (`diloco/bytes`) at H = 1 (a sync of
  the whole model every step: the data-parallel baseline), 8 and 32 with P = 1 in float32, and in
  bfloat16; and the peak payload of one sync at H = 8 with P = 1, 2 and 4 fragments (plain DiLoCo
  against Streaming DiLoCo). Targets: per step at least H x below H = 1 (2H x in bfloat16); peak per
  sync about P x lower with P fragments.
- reward: held-out reward at equal total rollouts, one island of batch B against two islands of
  batch B/2 each (their mean), --steps steps, per seed. Target: a gap of at most 0.02.
- link: seconds per outer sync (quorum to commit) with the islands on loopback, and in two network
  namespaces joined by a veth pair shaped by `tc netem` (--link DELAY_MS,RATE_MBIT one way; `tc tbf`,
  rate only, where the kernel lacks netem: the result says which ran), which the benchmark creates
  and removes (support/netem.py); P = 1 and 4 at H = 8.

A run whose metrics are complete in --work is reused, not rerun (delete --work to measure anew).

Prints the tables and writes <results>/diloco.json, stamped with the machine, date and commit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from support import netem  # noqa: E402
from support.cli import commit, git  # noqa: E402
from support.spread import spread  # noqa: E402

from composer_prime.utils.logs import setup  # noqa: E402
from composer_prime.utils.net import free_port  # noqa: E402
from composer_prime.utils.progress import Progress  # noqa: E402
from composer_prime.utils.report import metrics_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BATCH = 128  # the quickstart's
RL = [sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/quickstart.toml"]


def common(run: Path, steps: int, seed: int, batch: int) -> list[str]:
    return ["--output_dir", str(run), "--max_steps", str(steps), "--seed", str(seed), "--orchestrator.batch_size", str(batch),
            "--inference.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}",
            "--orchestrator.eval.interval", "1000000", "--orchestrator.eval.num_tasks", "96"]


def rl(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def finish(procs: list[subprocess.Popen], logs: list[Path], budget: float) -> None:
    deadline = time.time() + budget
    for p, log in zip(procs, logs):
        rc = p.wait(timeout=max(1.0, deadline - time.time()))
        if rc != 0:
            raise SystemExit(f"diloco: a run failed (exit {rc}); its log: {log}\n{log.read_text()[-2000:]}")


def finished(trainer_dirs: list[Path], steps: int) -> bool:
    """A run of these settings already done (its every trainer logged every step): reused, not rerun."""
    return all(len(metrics_rows(d / "metrics.jsonl")) == steps for d in trainer_dirs)


def islands(run: Path, steps: int, seed: int, batch: int, h: int, p: int, wire: str = "float32") -> list[dict]:
    """Two islands under one `rl`; per island its trainer's and orchestrator's metrics rows."""
    cmd = [*RL, "@", "configs/diloco.toml", *common(run, steps, seed, batch), "--diloco.sync_every", str(h),
           "--diloco.fragments", str(p), "--diloco.wire_dtype", wire, "--diloco.lighthouse_port", str(free_port())]
    if not finished([run / f"island{k}" / "trainer" for k in (0, 1)], steps):
        finish([rl(cmd, run / "bench.log")], [run / "bench.log"], 1800)
    return [{"trainer": metrics_rows(run / f"island{k}" / "trainer" / "metrics.jsonl"),
             "orchestrator": metrics_rows(run / f"island{k}" / "orchestrator" / "metrics.jsonl")} for k in (0, 1)]


def syncs(island: dict) -> list[dict]:
    return [r for r in island["trainer"] if r.get("diloco/syncs")]


def final_reward(island: dict) -> float:
    return [r for r in island["orchestrator"] if "eval_reward" in r][-1]["eval_reward"]


def fragment_h(a: argparse.Namespace) -> int:
    """The H the fragment counts are compared at: 8 where measured, else the largest."""
    return 8 if 8 in a.sync_every else max(a.sync_every)


def bytes_cases(a: argparse.Namespace) -> list[tuple[int, int, str]]:
    """(H, P, wire): every H with P = 1 in float32 (H = 1 first: the baseline), every H > 1 in
    bfloat16, then each P > 1 that divides H at fragment_h."""
    h_p = fragment_h(a)
    return ([(h, 1, "float32") for h in sorted(set(a.sync_every) | {1})] + [(h, 1, "bfloat16") for h in a.sync_every if h > 1]
            + [(h_p, p, "float32") for p in a.fragments if p > 1 and h_p % p == 0])


def bytes_result(a: argparse.Namespace, progress: Progress) -> dict:
    rows = []
    for h, p, wire in bytes_cases(a):
        run = islands(a.work / f"bytes-h{h}-p{p}-{wire}", max(a.sync_every), 0, 32, h, p, wire)
        per_sync = [s["diloco/bytes"] for s in syncs(run[0])]
        rows.append({"sync_every": h, "fragments": p, "wire_dtype": wire, "syncs": len(per_sync),
                     "bytes_per_step": sum(per_sync) / len(run[0]["trainer"]), "peak_bytes_per_sync": max(per_sync),
                     "committed_with_both": all(s["diloco/participants"] == 2 for s in syncs(run[0]))})
        progress.advance()
    base = next(r["bytes_per_step"] for r in rows if (r["sync_every"], r["wire_dtype"]) == (1, "float32"))
    for r in rows:
        r["step_reduction_vs_h1"] = round(base / r["bytes_per_step"], 2)
        target = r["sync_every"] * (2 if r["wire_dtype"] == "bfloat16" else 1)
        r["target_reduction"], r["met"] = target, r["step_reduction_vs_h1"] >= target * 0.999
    plain = next(r for r in rows if (r["sync_every"], r["fragments"], r["wire_dtype"]) == (fragment_h(a), 1, "float32"))
    for r in rows:
        r["peak_reduction_vs_plain"] = round(plain["peak_bytes_per_sync"] / r["peak_bytes_per_sync"], 2)
    return {"cases": rows}


def reward_result(a: argparse.Namespace, progress: Progress) -> dict:
    per_seed = []
    for seed in a.seeds:
        one = a.work / f"reward-one-{seed}"
        if not finished([one / "trainer"], a.steps):
            finish([rl([*RL, *common(one, a.steps, seed, BATCH)], one / "bench.log")], [one / "bench.log"], 1800)
        one_r = [r for r in metrics_rows(one / "orchestrator" / "metrics.jsonl") if "eval_reward" in r]
        progress.advance()
        two = islands(a.work / f"reward-two-{seed}", a.steps, seed, BATCH // 2, 8, 2)
        progress.advance()
        start = one_r[0]["eval_reward"]
        both = [final_reward(i) for i in two]
        per_seed.append({"seed": seed, "start": start, "one_island": one_r[-1]["eval_reward"], "two_islands": both,
                         "two_islands_mean": statistics.mean(both), "gap": one_r[-1]["eval_reward"] - statistics.mean(both)})
    return {"steps": a.steps, "rollouts_per_step_total": BATCH, "seeds": per_seed,
            "gap": spread([s["gap"] for s in per_seed]), "target_gap": 0.02,
            "met": all(abs(s["gap"]) <= 0.02 for s in per_seed)}


def link_result(a: argparse.Namespace, progress: Progress) -> dict:
    why = netem.available()
    out: dict = {"delay_ms": a.link[0], "rate_mbit": a.link[1], "cases": []}
    if why:
        return out | {"skipped": why}
    for p in (1, 4):
        loop = islands(a.work / f"link-loopback-p{p}", 16, 0, 32, 8, p)
        progress.advance()
        with netem.slow_link(*a.link) as (prefix, addr, dev, shaping):
            out["shaping"] = shaping
            port, run = free_port(), a.work / f"link-netem-p{p}"
            run.mkdir(parents=True, exist_ok=True)
            house = subprocess.Popen([*prefix[0], sys.executable, "-m", "composer_prime.entrypoints.lighthouse",
                                      "--host", addr[0], "--port", str(port), "--trusted_network", "true"], cwd=ROOT,
                                     stdout=(run / "lighthouse.log").open("w"), stderr=subprocess.STDOUT)
            try:
                procs, logs = [], []
                for k in (0, 1):
                    cmd = [*prefix[k], *RL, "@", "configs/diloco.toml", *common(run, 16, 0, 32), "--diloco.sync_every", "8",
                           "--diloco.fragments", str(p), "--diloco.island", str(k), "--diloco.lighthouse",
                           f"{addr[0]}:{port}", "--diloco.host", addr[k], "--diloco.trusted_network", "true"]
                    logs.append(run / f"bench-{k}.log")
                    procs.append(rl(cmd, logs[-1], {"GLOO_SOCKET_IFNAME": dev[k]}))
                finish(procs, logs, 1800)
            finally:
                house.terminate()
                house.wait(timeout=30)
        slow = [{"trainer": metrics_rows(run / f"island{k}" / "trainer" / "metrics.jsonl")} for k in (0, 1)]
        progress.advance()
        for name, r in (("loopback", loop), ("shaped", slow)):
            s = syncs(r[0])
            out["cases"].append({"link": name, "fragments": p, "syncs": len(s), "bytes_per_sync": max(x["diloco/bytes"] for x in s),
                                 "sync_s": spread([x["diloco/sync_s"] for x in s])})
    return out


PARTS = {"bytes": bytes_result, "reward": reward_result, "link": link_result}


def stamp() -> dict:
    return {"machine": f"{platform.machine()} cores={os.cpu_count()}", "date": datetime.date.today().isoformat(),
            "commit": commit(),
            "changed_since_commit": bool(git("status", "--porcelain", "--", "composer_prime/trainer", "composer_prime/config"))}


def tables(r: dict) -> str:
    lines = [f"diloco ({r['machine']}, {r['date']}, {r['commit']})"]
    if "bytes" in r:
        lines += ["", "bytes per island", "| H | P | wire | syncs | bytes/step | ×below H=1 (target) | peak bytes/sync | "
                  "×below plain |", "|---|---|---|---|---|---|---|---|"]
    for c in r.get("bytes", {}).get("cases", []):
        lines.append(f"| {c['sync_every']} | {c['fragments']} | {c['wire_dtype']} | {c['syncs']} | {c['bytes_per_step']:,.0f} | "
                     f"{c['step_reduction_vs_h1']} ({c['target_reduction']}) | {c['peak_bytes_per_sync']:,.0f} | {c['peak_reduction_vs_plain']} |")
    if "reward" in r:
        lines += reward_table(r["reward"])
    if "link" in r:
        lines += link_table(r["link"])
    return "\n".join(lines)


def reward_table(w: dict) -> list[str]:
    lines = ["", f"held-out reward after {w['steps']} steps, {w['rollouts_per_step_total']} rollouts a step in all",
              "| seed | start | one island | two islands (each) | gap |", "|---|---|---|---|---|"]
    for s in w["seeds"]:
        lines.append(f"| {s['seed']} | {s['start']:.3f} | {s['one_island']:.3f} | {' / '.join(f'{x:.3f}' for x in s['two_islands'])} | "
                     f"{s['gap']:+.3f} |")
    return lines


def link_table(k: dict) -> list[str]:
    lines = ["", f"seconds per sync, H = 8 ({k.get('shaping', 'link not shaped')})"]
    if "skipped" in k:
        lines.append(f"not run: {k['skipped']}")
    else:
        lines += ["| link | P | syncs | bytes/sync | s/sync median [range] |", "|---|---|---|---|---|"]
        lines += [f"| {c['link']} | {c['fragments']} | {c['syncs']} | {c['bytes_per_sync']:,.0f} | "
                  f"{c['sync_s']['median']} [{c['sync_s']['min']}, {c['sync_s']['max']}] |" for c in k["cases"]]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=32, help="trainer steps of the reward comparison")
    p.add_argument("--seeds", default="0,1", help="seeds of the reward comparison, comma-separated")
    p.add_argument("--link", default="25,100", help="the emulated link: one-way delay in ms, rate in Mbit/s")
    p.add_argument("--sync-every", default="1,8,32", help="bytes: the H values (1, the baseline, is always run)")
    p.add_argument("--fragments", default="1,2,4", help="bytes: the P values, at H = 8 (or the largest H)")
    p.add_argument("--parts", default="bytes,reward,link", help="which results to produce, comma-separated")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-diloco")
    a = p.parse_args()
    try:
        a.seeds = [int(s) for s in a.seeds.split(",")]
        a.link = [float(x) for x in a.link.split(",")]
        a.sync_every, a.fragments = [int(x) for x in a.sync_every.split(",")], [int(x) for x in a.fragments.split(",")]
    except ValueError:
        p.error("--seeds, --sync-every and --fragments want comma-separated integers, --link DELAY_MS,RATE_MBIT")
    parts = a.parts.split(",")
    if a.steps < 8 or len(a.link) != 2 or min(a.link) <= 0 or min(a.sync_every + a.fragments) < 1:
        p.error("--steps must be at least 8 (one sync of each fragment); --link two positive numbers; H and P at least 1")
    if not set(parts) <= set(PARTS):
        p.error(f"--parts: choose from {', '.join(PARTS)}")
    setup("diloco", stderr=True)  # the progress lines; the tables go to stdout
    runs = {"bytes": len(bytes_cases(a)), "reward": 2 * len(a.seeds), "link": 4 if netem.available() is None else 0}
    with Progress("diloco", total=sum(runs[x] for x in parts), unit="runs") as progress:
        result = stamp() | {x: PARTS[x](a, progress) for x in parts}
    a.results.mkdir(parents=True, exist_ok=True)
    (a.results / "diloco.json").write_text(json.dumps(result, indent=1))
    print(tables(result) + f"\n\nwritten {a.results / 'diloco.json'}")


if __name__ == "__main__":
    main()

"""Weight broadcast: ours vs stock `shardcast` vs parallel `cp`, and full vs delta bytes per RL step.

    uv run python benchmarks/broadcast.py [--sizes 10,100,1000] [--clients 4] [--repeats 5]
                                          [--delta-steps 12] [--results DIR] [--work DIR]

For each checkpoint size (MB): one origin -> one relay -> N clients on loopback, timed from the
moment the step directory exists until every client holds a verified copy:
  - ours: Origin (in this process), `relay` process, N client processes (Downloader, long-poll);
  - stock shardcast 0.3.2: OriginServer + broadcast() here, its MiddleNode (check_interval=1 s,
    kinder than its 30 s default) and N ClientNode processes polling every 0.2 s (each with its own
    temp file: stock clients on one machine share one in site-packages and race on it);
  - `cp` of the same file to N destinations in parallel: the physical limit of this disk.
Each size is timed `--repeats` times, the three systems interleaved within each repeat; the table
gives the median and the range, and in how many repeats ours beat stock shardcast.
Then bytes on the wire per RL step, full vs delta, on the last three trainer steps of a short
quickstart run (fp32 as trained, and bf16 as `weight_broadcast.dtype = "bfloat16"` publishes).
Prints a table and writes <results>/broadcast.json (default benchmarks/results); scratch files
go under <work> (default outputs/bench-broadcast), created if missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from composer_prime.contract.weights import Shardcast  # noqa: E402
from composer_prime.transports.weights.shardcast.client import Downloader  # noqa: E402
from composer_prime.transports.weights.shardcast.manifest import load_or_create_key, public_hex  # noqa: E402
from composer_prime.transports.weights.shardcast.origin import Origin  # noqa: E402
from composer_prime.utils.logs import setup  # noqa: E402
from composer_prime.utils.net import free_port  # noqa: E402
from composer_prime.utils.progress import Progress  # noqa: E402
from support.spread import spread  # noqa: E402  (this script's folder is on sys.path)

SHARD = 50_000_000  # SHARDCAST's default shard size, for both systems


def make_step(root: Path, mb: int) -> Path:
    d = root / "step_1"
    d.mkdir(parents=True)
    save_file({"w": torch.randn(mb * 1_000_000 // 4)}, d / "model.safetensors")
    (d / "config.json").write_text('{"model_type": "bench"}')
    return d


def start_clients(argvs: list[list[str]]) -> list[subprocess.Popen]:
    """Start clients one by one; each prints "ready" once it waits for the step (the clock starts
    after all are). One by one because stock shardcast clients share /tmp/dummy.bin at start-up."""
    procs = []
    for argv in argvs:
        p = subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while (line := p.stdout.readline()) and line.strip() != "ready":
            pass
        if not line:
            raise RuntimeError(f"client exited before it was ready (code {p.wait()})")
        procs.append(p)
    return procs


def kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


def wait_lines(procs: list[subprocess.Popen], timeout: float) -> list[float]:
    """Each client prints the time it finished; returns them (raises if one fails)."""
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"client failed: {stdout[-500:]}")
        out.append(float(stdout.strip().splitlines()[-1]))
    return out


# ---------------------------------------------------------------- ours
def client_ours(url: str, key: str, out: str) -> None:
    async def go():
        dl = Downloader(Shardcast((url,), key), Path(out) / "work")
        await dl.latest(after=0, wait_s=0)  # connected
        print("ready", flush=True)
        while await dl.latest(after=0, wait_s=60) < 1:
            pass
        await dl.fetch(1, Path(out) / "step_1")
        await dl.close()
    asyncio.run(go())
    print(time.time(), flush=True)


def run_ours(tmp: Path, step: Path, clients: int) -> float:
    key = load_or_create_key(tmp / "key")
    origin = Origin(tmp / "origin", key, port=free_port(), shard_size=SHARD).start()
    relay_port = free_port()
    procs: list[subprocess.Popen] = []
    relay = subprocess.Popen([sys.executable, "-m", "composer_prime.entrypoints.relay", "--upstream", origin.url,
                              "--public_key", public_hex(key), "--port", str(relay_port), "--data_dir",
                              str(tmp / "relay")], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{relay_port}/health")
        procs = start_clients([["--client-ours", f"http://127.0.0.1:{relay_port}", public_hex(key), str(tmp / f"c{i}")]
                               for i in range(clients)])
        start = time.time()
        origin.publish(1, step)
        return max(wait_lines(procs, 600)) - start
    finally:
        kill_all([relay, *procs])
        origin.stop()


# ---------------------------------------------------------------- stock shardcast
def _loopback() -> None:
    import shardcast.server as scs

    init = scs.ShardcastServer.__init__
    scs.ShardcastServer.__init__ = lambda self, addr, *a, **k: init(self, ("127.0.0.1", addr[1]), *a, **k)


def middle_shardcast(upstream: str, data: str, port: str) -> None:
    _loopback()
    from shardcast import MiddleNode

    MiddleNode([upstream], data, port=int(port), check_interval=1)
    while True:
        time.sleep(3600)


def client_shardcast(url: str, out: str) -> None:
    import shardcast.client as scc
    from shardcast import ClientNode

    # Stock clients write distribution.txt to <site-packages>/temp_distribution.txt and delete it: four
    # on one machine race on that one file ("No versions available", seen here). Give each its own.
    Path(out, "pkg").mkdir(parents=True, exist_ok=True)
    scc.__file__ = str(Path(out, "pkg", "client.py"))
    client = ClientNode([url], output_dir=out)
    print("ready", flush=True)
    while "v1" not in client.list_available_versions():
        time.sleep(0.2)
    if client.download_version("v1") is None:
        raise SystemExit("shardcast download failed verification")
    print(time.time(), flush=True)


def run_shardcast(tmp: Path, step: Path, clients: int) -> float:
    _loopback()
    from shardcast import OriginServer

    odir, mdir = tmp / "sc-origin", tmp / "sc-middle"
    for d in (odir, mdir):
        d.mkdir()
        (d / "data1.bin").write_bytes(b"\0" * 1024)
    oport, mport = free_port(), free_port()
    origin = OriginServer(str(odir), port=oport)
    procs: list[subprocess.Popen] = []
    middle = subprocess.Popen([sys.executable, __file__, "--middle-shardcast", f"http://127.0.0.1:{oport}", str(mdir),
                               str(mport)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{mport}/data1.bin")
        procs = start_clients([["--client-shardcast", f"http://127.0.0.1:{mport}", str(tmp / f"sc{i}")]
                               for i in range(clients)])
        start = time.time()
        origin.broadcast(str(step / "model.safetensors"), shard_size=SHARD)
        return max(wait_lines(procs, 900)) - start
    finally:
        kill_all([middle, *procs])
        origin.shutdown()


# ---------------------------------------------------------------- parallel cp
def run_cp(tmp: Path, step: Path, clients: int) -> float:
    start = time.time()
    procs = [subprocess.Popen(["cp", str(step / "model.safetensors"), str(tmp / f"cp{i}.bin")]) for i in range(clients)]
    for p in procs:
        p.wait()
    return time.time() - start


# ---------------------------------------------------------------- delta on real steps
def delta_bytes(work: Path, last: int) -> list[dict]:
    """Full and delta bytes of steps last-2..last of a quickstart run (made once under `work`, then reused)."""
    run = work / f"run-{last}-steps"
    if not (run / "weights" / f"step_{last}" / "STABLE").exists():
        # only its weights are read: held-out evaluation cut to the least the orchestrator does (one task)
        subprocess.run([sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/quickstart.toml",
                        "--output_dir", str(run), "--max_steps", str(last), "--orchestrator.eval.num_tasks", "1",
                        "--inference.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}"],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        with tempfile.TemporaryDirectory() as t:
            tmp = Path(t)
            origin = Origin(tmp / "origin", load_or_create_key(tmp / "key"), port=free_port(), shard_size=SHARD)
            for s in (last - 2, last - 1, last):
                src = run / "weights" / f"step_{s}"
                d = tmp / f"step_{s}"
                shutil.copytree(src, d)
                save_file({k: v.to(dtype) for k, v in load_file(src / "model.safetensors").items()}, d / "model.safetensors",
                          metadata={"format": "pt"})
                m = origin.publish(s, d)
                if m.delta is not None:
                    rows.append({"dtype": str(dtype).split(".")[1], "step": s, "full_bytes": m.total_size,
                                 "delta_bytes": m.delta.size, "ratio": round(m.total_size / m.delta.size, 2)})
    return rows


def time_size(work: Path, mb: int, clients: int, repeats: int, progress: Progress) -> dict:
    """`repeats` timings of each system on one step of `mb` MB; the systems take turns within a repeat."""
    systems = {"cp_parallel_s": run_cp, "ours_s": run_ours, "shardcast_s": run_shardcast}
    times: dict[str, list[float]] = {name: [] for name in systems}
    with tempfile.TemporaryDirectory(dir=work) as t:
        tmp = Path(t)
        step = make_step(tmp / "src", mb)
        for _ in range(repeats):
            for name, fn in systems.items():
                scratch = tmp / name
                scratch.mkdir()
                os.sync()
                times[name].append(fn(scratch, step, clients))
                shutil.rmtree(scratch)
                progress.advance(note=f"{mb} MB")
    row = {"size_mb": mb, "clients": clients, "repeats": repeats, **{name: spread(ts) for name, ts in times.items()}}
    row["ours_vs_cp"] = round(row["ours_s"]["median"] / row["cp_parallel_s"]["median"], 2)
    row["shardcast_vs_ours"] = round(row["shardcast_s"]["median"] / row["ours_s"]["median"], 2)
    row["ours_faster_in"] = sum(o < s for o, s in zip(times["ours_s"], times["shardcast_s"]))
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10,100,1000", help="checkpoint sizes in MB, comma-separated")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5, help="timings per size and system")
    p.add_argument("--delta-steps", type=int, default=12, help="quickstart steps to run for the delta table (>= 3)")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-broadcast")
    a = p.parse_args()
    setup("broadcast", stderr=True)  # the progress lines; the tables go to stdout
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes must be whole numbers of MB separated by commas, got {a.sizes!r}")
    if min(sizes) < 1 or a.clients < 1 or a.repeats < 1 or a.delta_steps < 3:
        p.error("--sizes, --clients and --repeats must be at least 1, --delta-steps at least 3")
    a.work = a.work.resolve()  # the quickstart run of the delta table starts in the repository root
    a.work.mkdir(parents=True, exist_ok=True)
    results = []
    with Progress("broadcast", len(sizes) * a.repeats * 3, "timings") as progress:  # 3 systems
        for mb in sizes:
            results.append(time_size(a.work, mb, a.clients, a.repeats, progress))
            progress.echo(str(results[-1]), file=sys.stdout)
    deltas = delta_bytes(a.work, a.delta_steps)
    a.results.mkdir(parents=True, exist_ok=True)
    out = a.results / "broadcast.json"
    out.write_text(json.dumps({"machine": f"cores={os.cpu_count()}", "shard_size": SHARD, "broadcast": results,
                               "delta": deltas}, indent=2))
    cell = lambda d: f"{d['median']} s ({d['min']}-{d['max']})"  # noqa: E731
    print("\n| size | repeats | parallel cp | ours | stock shardcast | ours / cp | shardcast / ours | ours faster |"
          "\n|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['size_mb']} MB | {r['repeats']} | {cell(r['cp_parallel_s'])} | {cell(r['ours_s'])} | "
              f"{cell(r['shardcast_s'])} | {r['ours_vs_cp']}x | {r['shardcast_vs_ours']}x | "
              f"{r['ours_faster_in']} of {r['repeats']} |")
    print("(median over the repeats, range in brackets; ratios of medians)")
    print("\n| dtype | step | full bytes | delta bytes | full / delta |\n|---|---|---|---|---|")
    for r in deltas:
        print(f"| {r['dtype']} | {r['step']} | {r['full_bytes']:,} | {r['delta_bytes']:,} | {r['ratio']}x |")
    print(f"\nwritten {out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client-ours":
        client_ours(*sys.argv[2:5])
    elif len(sys.argv) > 1 and sys.argv[1] == "--middle-shardcast":
        middle_shardcast(*sys.argv[2:5])
    elif len(sys.argv) > 1 and sys.argv[1] == "--client-shardcast":
        client_shardcast(*sys.argv[2:4])
    else:
        main()

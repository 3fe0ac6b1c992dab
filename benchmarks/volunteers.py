"""Volunteers (issue 27): the validator's calibration, what proofs and validation cost, and
rollouts/s with volunteer workers against trusted inference alone.

    uv run python benchmarks/volunteers.py --result calibration [--models tiny,smollm2-135m]
        [--dtypes float32,bfloat16] [--honest 64] [--cheats 8] [--trusted-isa AVX2] [--served bfloat16] [--engine vllm [--draws engine]]
        [--device cuda]
    uv run python benchmarks/volunteers.py --result overhead [--models tiny,smollm2-135m] [--repeats 5]
    uv run python benchmarks/volunteers.py --result throughput [--workers 2] [--steps 4] [--batch 64] [--repeats 5]
    (each also takes --results DIR, default benchmarks/results, and --work DIR, default outputs/bench-volunteers)

calibration: per model and dtype (`volunteers.dtype`: what workers generate and audits prefill
in), a trusted server (embedded engine; serving in that dtype, or in `--served`'s: a bfloat16 run
auditing in float32 through a copy of its weights, written as `calibration-served-<dtype>`) at
weights v1, the model after one real trainer step (tests/support/volunteers.py `one_step`: the
trainer's AdamW at lr 1e-4 on a cross-entropy loss; the "one step behind" cheat answers with v0),
which the workers pull from the run's weights directory, and the real pool and validator; the
workers generate with `--engine` (hf, or vllm: vLLM generates with the seeded sampler, or with `--draws engine` its own, tested statistically, and one prefill
gives the proofs' states; written as `-engine-vllm[-draws-engine]`) (tests/support/volunteers.py, as the tests wire them); an honest worker answers
`--honest` leases (chat prompts, 64 tokens at temperature 1, 8 in flight so its engine batches
them) and each red-team cheat `--cheats`. Every audit's raw measurements are kept; the verdicts
are the validator's at the config's default thresholds. The result: the
honest maxima (what the thresholds must clear), false rejects, and per cheat its verdicts and
false accepts (targets: no false accept, at most 1% false rejects). With `--trusted-isa`, the
trusted server's oneDNN kernels are capped at that instruction set (ONEDNN_MAX_CPU_ISA), as on a
CPU without this one's AVX-512: a validator on another machine than its workers (written as
`calibration-trusted-<ISA>`).

overhead: per model (float32), 8 completions generated as one batch by the embedded engine as the
worker runs it (keeping each token's last hidden state while decoding) and by one that keeps
none, in turns; then the TOPLOC proofs built from the kept states, and each completion's audit
on a trusted server; medians and ranges over `--repeats`, as fractions of the plain generation
time: keeping the states, building the proofs, both (the worker's whole proving cost; target at
most 2%), the audit; proof bytes per 32 tokens.

throughput: the quickstart's environment and tiny model, the orchestrator's own `collect` and
`build` on one trusted server alone, and on the same server with the pool and `--workers` `uv
run worker` processes joined, batch by batch in turns; rollouts/s per system, median and range
over `--repeats` of `--steps` batches.

Each prints a table and merges its result into <results>/volunteers.json, stamped with the
machine, date and commit.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from openenv import stamp  # noqa: E402
from replay_ab import ROOT, serving  # noqa: E402
from support.calibration import CHEATS, calibrate, prompts, summarise  # noqa: E402
from support.spread import spread  # noqa: E402

from composer_prime.config.sampling import SamplingParams  # noqa: E402
from composer_prime.config.volunteers import VolunteersConfig  # noqa: E402
from composer_prime.model.resolve import resolve_model  # noqa: E402
from composer_prime.utils.logs import setup  # noqa: E402
from composer_prime.utils.proc import die_with_parent  # noqa: E402
from composer_prime.utils.progress import Progress  # noqa: E402
from composer_prime.verify.toploc import ProofError, require  # noqa: E402

async def overhead_once(engines: dict, trusted: str, ps: list[list[int]], seed: int) -> dict:
    import aiohttp

    from composer_prime.verify import toploc

    async def timed(coro):
        t = time.perf_counter()
        return await coro, time.perf_counter() - t
    params = [SamplingParams(max_tokens=64, seed=seed + i) for i in range(len(ps))]
    gens, gen_s = await timed(asyncio.gather(*(engines["plain"].generate(p, s) for p, s in zip(ps, params))))
    kept, kept_s = await timed(asyncio.gather(*(engines["kept"].generate_with_states(p, s) for p, s in zip(ps, params))))
    assert [g.token_ids for g in gens] == [g.token_ids for g, _ in kept]  # the same completions, the states besides
    build_s = audit_s = 0.0
    sizes = []
    async with aiohttp.ClientSession() as http:
        for p, (g, states) in zip(ps, kept):
            t = time.perf_counter()
            proofs = toploc.build(states)
            build_s += time.perf_counter() - t
            sizes += [len(base64.b64decode(x)) for x in proofs]
            t = time.perf_counter()
            body = {"weight_version": 0, "token_ids": p + g.token_ids, "prompt_len": len(p), "proofs": proofs,
                    "logprobs": g.logprobs, "seed": seed, "sampling_params": {"max_tokens": 64}}
            async with http.post(f"{trusted}/inference/v1/audit", json=body) as r:
                r.raise_for_status()
            audit_s += time.perf_counter() - t
    keep = max(0.0, kept_s - gen_s)
    return {"gen_s": gen_s, "keep_frac": keep / gen_s, "build_frac": build_s / gen_s, "prove_frac": (keep + build_s) / gen_s,
            "audit_frac": audit_s / gen_s, "tokens": sum(len(g.token_ids) for g in gens), "proof_bytes": sizes}


FRACTIONS = ("gen_s", "keep_frac", "build_frac", "prove_frac", "audit_frac")


def overhead(model: str, repeats: int, work: Path, progress: Progress) -> dict:
    from composer_prime.inference.engines.hf.engine import HFEngine

    work.mkdir(parents=True, exist_ok=True)
    ps, _ = prompts(model, 8)
    with serving({"trusted": Path(resolve_model(model))}, work, ("--dtype", "float32", "--device", "cpu")) as urls:
        async def go():
            engines = {name: HFEngine(resolve_model(model), model, max_model_len=1024, max_batch=8, device="cpu",
                                      dtype="float32", keep_states=name == "kept") for name in ("plain", "kept")}
            for e in engines.values():
                await e.start()
            try:
                await overhead_once(engines, urls["trusted"], ps, 0)  # warm-up
                runs = []
                for i in range(repeats):
                    runs.append(await overhead_once(engines, urls["trusted"], ps, 100 * (i + 1)))
                    progress.advance(1, note=f"{model}: proving {runs[-1]['prove_frac']:.2%} of generation")
                return runs
            finally:
                for e in engines.values():
                    await e.stop()
        runs = asyncio.run(go())
    return {"runs": runs, **{k: spread([r[k] for r in runs], 4) for k in FRACTIONS},
            "proof_bytes_per_32_tokens": sorted({b for r in runs for b in r["proof_bytes"]})}


def throughput(workers: int, steps: int, batch: int, repeats: int, work: Path, progress: Progress) -> list[dict]:
    from composer_prime.config import OrchestratorConfig
    from composer_prime.orchestrator.orchestrator import Orchestrator
    from composer_prime.utils.net import free_port

    def orchestrator(url: str, volunteers: dict) -> Orchestrator:
        return Orchestrator(OrchestratorConfig.model_validate({
            "model": "tiny", "output_dir": str(work / "orchestrator"), "inference_urls": [url], "batch_size": batch,
            "group_size": 8, "seq_len": 128, "sampling": {"max_tokens": 16}, "dynamic_sampling": False,
            "max_async_level": 10**6, "max_concurrency": batch, "volunteers": volunteers}))

    with serving({"trusted": Path(resolve_model("tiny"))}, work, ("--device", "cpu")) as urls:
        port = free_port()
        systems = {"trusted alone": orchestrator(urls["trusted"], {}),
                   f"trusted + {workers} volunteers": orchestrator(urls["trusted"], {
                       "enabled": True, "port": port, "open": True, "join_token": "bench", "heartbeat_s": 2.0})}
        procs = []

        async def go() -> list[dict]:
            for o in systems.values():
                await o.envs[0].env.start()
                await o.client.wait_ready()
                await o.client.versions()
            [pool] = list(systems.values())[1].sources  # the volunteers' pool, the run's one node source
            await pool.start()
            for i in range(workers):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "composer_prime.entrypoints.worker", "--join", f"http://127.0.0.1:{port}",
                     "--token", "bench", "--key_path", str(work / f"w{i}.key"), "--work_dir", str(work / f"w{i}"),
                     "--device", "cpu", "--dtype", "float32"], cwd=ROOT, stdout=subprocess.DEVNULL,
                    stderr=(work / f"w{i}.log").open("w"), preexec_fn=die_with_parent(signal.SIGTERM)))
            while sum(pool.is_member(n) for n in pool.members) < workers:
                await asyncio.sleep(0.5)
            runs = []
            try:
                for o in systems.values():  # warm-up, untimed
                    await o.collect(10**6)
                for i in range(repeats):
                    spent = {name: [0.0, 0] for name in systems}
                    for step in range(i * steps, (i + 1) * steps):
                        for name in (list(systems) if step % 2 == 0 else list(reversed(systems))):
                            t = time.perf_counter()
                            c = await systems[name].collect(step)
                            await systems[name].build(step, c)
                            spent[name][0] += time.perf_counter() - t
                            spent[name][1] += sum(len(g) for g, _ in c.groups)
                    for name, (seconds, n) in spent.items():
                        runs.append({"system": name, "repeat": i, "rollouts_per_s": n / seconds, "rollouts": n})
                        progress.advance(1, note=f"{name} {runs[-1]['rollouts_per_s']:.1f} rollouts/s")
                runs.append({"pool": pool.metrics()})
            finally:
                await pool.stop()
                for o in systems.values():
                    await o.envs[0].env.close()
                    await o.client.close()
            return runs
        try:
            return asyncio.run(go())
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--result", choices=["calibration", "overhead", "throughput"], required=True)
    p.add_argument("--models", default="tiny,smollm2-135m")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--honest", type=int, default=64)
    p.add_argument("--cheats", type=int, default=8)
    p.add_argument("--trusted-isa", default="", help="calibration: cap the trusted server's oneDNN kernels (e.g. AVX2)")
    p.add_argument("--served", default="", choices=["", "float32", "bfloat16"],
                   help="calibration: the trusted server's dtype (default: each set's)")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="calibration: the workers' engine")
    p.add_argument("--draws", default="seeded", choices=["seeded", "engine"], help="calibration: a vllm worker's sampler")
    p.add_argument("--device", default="cpu", help="calibration: where the trusted server and the workers run (cpu, cuda)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-volunteers")
    a = p.parse_args()
    if min(a.honest, a.cheats, a.repeats, a.workers, a.steps) < 1 or a.batch % 8:
        p.error("counts must be at least 1 and --batch a multiple of 8")
    try:  # every result proves or verifies: said now, where leases would otherwise wait out their deadlines
        require()
    except ProofError as e:
        p.exit(2, f"error: {e}\n")
    setup("volunteers", stderr=True)
    work = a.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    models = a.models.split(",")
    result: dict = {**stamp(), "thresholds": VolunteersConfig().model_dump()["thresholds"]}
    if a.result == "calibration":
        sets = [(m, d) for m in models for d in a.dtypes.split(",")]
        with Progress("calibration", total=len(sets) * (1 + len(CHEATS)), unit="workers") as progress:
            result["sets"] = {f"{m} {d}": summarise(calibrate(m, d, a.honest, a.cheats, work / f"{m}-{d}", progress,
                                                              a.trusted_isa, a.served, a.engine, a.draws, a.device))
                              for m, d in sets}
        result["trusted_isa"], result["served"] = a.trusted_isa or "default", a.served or "each set's dtype"
        result["engine"], result["draws"], result["device"] = a.engine, a.draws, a.device
        table = ["| model, dtype | honest: n, false rejects; worst exp mismatches / mant mean / log-prob err / draw "
                 "distance / n x min p-value / surprisal z | cheats: false accepts of n (caught by) |", "|---|---|---|"]
        for key, s in result["sets"].items():
            h, mx, mn = s["honest"], s["honest"]["max"], s["honest"]["min"]
            table.append(f"| {key} | {h['n']}, {h['false_rejects']}; {mx['exp_mismatches']} / {mx['mant_err_mean']} / "
                         f"{mx['logprob_max_err']:.2g} / {mx['max_draw_distance']:.2g} / {mn['min_pvalue']:.2g} / "
                         f"{mn['surprisal_z']:.2f} | " + "; ".join(
                             f"{c}: {x['false_accepts']}/{x['n']} ({', '.join(sorted(k for k in x['verdicts'] if k))}"
                             + (f"; {x['as_drawn']} as drawn" if x["as_drawn"] else "") + ")"
                             for c, x in s["cheats"].items()) + " |")
    elif a.result == "overhead":
        with Progress("overhead", total=len(models) * a.repeats, unit="repeats") as progress:
            result["models"] = {m: overhead(m, a.repeats, work / m, progress) for m in models}
        table = ["| model | generation s (8 x 64 tokens) | keeping states / gen | proof build / gen | keep + build / gen "
                 "| audit / gen | proof bytes per 32 tokens |", "|---|---|---|---|---|---|---|"]
        for m, r in result["models"].items():
            table.append(f"| {m} | " + " | ".join(f"{r[k]['median']} [{r[k]['min']}, {r[k]['max']}]" for k in FRACTIONS)
                         + f" | {r['proof_bytes_per_32_tokens']} |")
    else:
        with Progress("throughput", total=2 * a.repeats, unit="runs") as progress:
            runs = throughput(a.workers, a.steps, a.batch, a.repeats, work, progress)
        result |= {"workers": a.workers, "steps": a.steps, "batch": a.batch, "repeats": a.repeats, "runs": runs,
                   "summary": {name: spread([r["rollouts_per_s"] for r in runs if r.get("system") == name])
                               for name in dict.fromkeys(r["system"] for r in runs if "system" in r)}}
        table = ["| system | rollouts/s, median [range] |", "|---|---|"]
        for name, s in result["summary"].items():
            table.append(f"| {name} | {s['median']} [{s['min']}, {s['max']}] |")
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]  # 1, 5, 15 min: how loaded the machine was
    out = a.results / "volunteers.json"
    a.results.mkdir(parents=True, exist_ok=True)
    merged = json.loads(out.read_text()) if out.exists() else {}
    name = a.result + "".join(f"-{k}-{v}" for k, v in (("trusted", a.trusted_isa), ("served", a.served),
                                                        ("engine", "" if a.engine == "hf" else a.engine),
                                                        ("draws", "" if a.draws == "seeded" else a.draws))
                              if a.result == "calibration" and v)
    merged[name] = result
    out.write_text(json.dumps(merged, indent=1))
    print("\n".join(["", *table, "", f"{name}: {result['machine']}, {result['date']}, commit {result['commit']}; "
                      f"written {out}"]))


if __name__ == "__main__":
    main()

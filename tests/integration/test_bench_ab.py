"""benchmarks/distill_ab.py and replay_ab.py end to end at their smallest settings (tests/support/bench_runs.py);
their runs side by side (benchmarks/support/runs.py); --device cuda refused where there is no GPU.

distill_ab runs in replay_ab's scratch directory: the two share their warm start (support/ab.warm_start) and their
GRPO arm (the same command), which it reuses (a finished run with the same command, support/ab.rl_runs), and runs
its distill arm alone; two arms at once are replay_ab's (ran_at_once)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.bench_runs import BENCHMARKS, ran_at_once, run


@pytest.fixture(scope="module")
def replay_ab(tmp_path_factory) -> tuple[dict, Path]:
    """replay_ab at its smallest; its results JSON and its scratch directory (its student and its runs)."""
    tmp = tmp_path_factory.mktemp("replay-ab")
    return run("replay_ab", tmp), tmp / "not-yet" / "outputs"


def test_distill_ab(replay_ab, tmp_path):
    scratch = replay_ab[1]
    grpo = json.loads((scratch / "grpo-s0" / "ab-wall.json").read_text())
    out = run("distill_ab", tmp_path, scratch=scratch)
    assert set(out["runs"]) == {"grpo", "grpo+distill"}
    for arm in out["runs"].values():
        assert [e["step"] for e in arm["0"]] == [0, 1]  # held-out at the start and after the one step
    assert set(out["summary"]["grpo+distill"]) >= {"final_tool_error_rate", "ratio_over_grpo", "target_met"}
    records = out["run_records"]
    # the GRPO arm replay_ab ran, reused with its recorded wall time; the distill arm run here, from the same student
    assert [(r["name"], r["status"]) for r in records] == [("grpo-s0", "reused"), ("grpo+distill-s0", "ok")]
    command = json.loads((scratch / "grpo+distill-s0" / "ab-command.json").read_text())
    assert {k: records[0][k] for k in grpo} == grpo and command[command.index("--model") + 1] == str(scratch / "agent")
    assert (out["device"], out["parallel"], out["model"]) == ("cpu", 2, "tiny") and out["machine"] and out["commit"]
    assert out["wall"]["run_wall_s"]["runs"] == [records[1]["wall_s"]]  # the runs made here: reused ones left out


def test_replay_ab(replay_ab):
    out = replay_ab[0]
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
    [first] = out["dpo"]["grpo+replay-dpo"]["0"]
    # step 0: the reference (configs/replay.toml's: the run's initial weights, scored by the trainer) is the policy,
    # so every pair's loss is ln 2, at configs/replay.toml's starting weight 0.5
    assert first["step"] == 0 and first["loss"] == pytest.approx(0.5 * 0.693147, abs=1e-6)
    records = out["run_records"]
    assert [(r["name"], r["status"]) for r in records] == [("grpo-s0", "ok"), ("grpo+replay-dpo-s0", "ok")]
    ran_at_once(records)
    assert out["record_run"]["status"] == "ok" and out["record_run"]["end"] <= min(r["start"] for r in records)


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
    # a timeout test: the one that sleeps 2 s took at least that; the one on a 2 s budget was stopped by it (SIGTERM,
    # -15 above) where it would have slept 60 s: lower bounds only, which no slow host can break (no margin needed)
    assert 2 <= records[1]["wall_s"] and 2 <= records[2]["wall_s"]
    ran_at_once(records)
    err = capsys.readouterr().err
    assert "test: fails FAILED after" in err and f"s (exit code 3); log: {tmp_path / 'fails.log'}" in err
    with pytest.raises(SystemExit) as stop:
        exit_if_failed(records)
    assert stop.value.code == f"1 of 3 runs failed: fails (log: {tmp_path / 'fails.log'})"

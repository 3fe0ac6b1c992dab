"""The benchmarks against other systems end to end at their smallest settings (tests/support/bench_runs.py):
benchmarks/vs_trl.py (ours against TRL's GRPO) and openenv.py (in-process against an OpenEnv server)."""

import pytest

from tests.support.bench_runs import recorded, run


def test_vs_trl(tmp_path):
    out = run("vs_trl", tmp_path)
    assert (out["systems"], out["batch"]) == (["ours-hf", "trl"], 16)
    for name in out["systems"]:
        [r] = out[name]
        times = [t for t, _ in r["curve"]]
        # the starting model, then the weights after steps 2 and 4, on the run's own clock; budget_s is the run's
        # timeout (tests/support/bench_runs.py: 900 s, a margin of 30x over a fast host), its budget the 4 steps
        assert r["steps"] == 4 and len(times) == 3 and times == sorted(times) and 0 < times[-1] <= out["budget_s"]
        assert all(0 <= reward <= 1 for _, reward in r["curve"])
    b = out["ours-hf"][0]["breakdown"]
    t = b["trainer"]
    assert b["steps"] == 1 and recorded(t["forward_s"], t["backward_s"], t["publish_s"])
    assert recorded(b["inference"]["load_s"])  # read from the inference server while the run was up
    # the trainer's idle, compute and hand-off times make up its step time (up to writing its metrics line)
    assert sum(t.values()) == pytest.approx(b["step_s"], rel=0.1)


def test_openenv(tmp_path):
    out = run("openenv", tmp_path)
    assert (out["steps"], out["batch"], out["repeats"], out["sft_steps"], out["target"]) == (1, 8, 1, 0, 0.1)
    runs = {r["system"]: r for r in out["runs"]}
    assert list(runs) == ["in-process", "openenv"] and all(r["rollouts"] == 8 and recorded(r["seconds"]) for r in runs.values())
    for name, r in runs.items():
        assert out["summary"][name]["rollouts_per_s"]["runs"] == [round(r["rollouts_per_s"], 3)]
    local, served = runs["in-process"]["rollouts_per_s"], runs["openenv"]["rollouts_per_s"]
    assert out["slowdown"]["runs"] == [round(1 - served / local, 3)]
    assert out["target_met"] == (out["slowdown"]["median"] <= 0.1) and set(out) >= {"machine", "date", "commit"}

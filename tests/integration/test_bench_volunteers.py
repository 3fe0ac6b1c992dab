"""benchmarks/volunteers.py's overhead and throughput end to end at their smallest settings
(tests/support/bench_runs.py; its calibration is the GPU check's step, test_bench_gpu_check.py); without
TOPLOC one line and exit code 2."""

import subprocess
import sys

import pytest

from tests.support.bench_runs import BENCHMARKS, recorded, run


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


def test_volunteers_overhead(tmp_path):
    out = run("volunteers:overhead", tmp_path)["overhead"]["models"]["tiny"]
    [r] = out["runs"]
    assert r["tokens"] > 0 and recorded(r["gen_s"]) and r["keep_frac"] >= 0 and r["audit_frac"] > 0
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

"""The report of a resumed run covers the whole run (utils/report.py, utils/report_segments.py; issue 46): its
wall time is the sum of its segments' (the resumed rl alone counted only its own part, so rollouts/s came out
inflated), it says where it was resumed, and a step's time is never taken across the stop and the pause
before the resume. The segments are recorded as rl records them (report_segments.begin and end)."""

import json

from composer_prime.utils import report_segments
from composer_prime.utils.report import summarize, write_report


def write_rows(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def resumed_run(run) -> None:
    """Steps 0-3 in a first segment (from t=1000; its trainer then stalled and the run was stopped at t=1400),
    resumed from the step-4 checkpoint at t=5000, steps 4-7 there, 10 s a step in both, 128 rollouts each."""
    report_segments.begin(run, None, "b", [], now=1000.0)
    report_segments.end(run, now=1400.0)
    times = {s: (1010.0 if s < 4 else 4990.0) + 10 * s for s in range(8)}  # 1010..1040, then 5030..5060
    report_segments.begin(run, 4, "b", list(times.values()), now=5000.0)
    report_segments.end(run, now=5070.0)
    phases = {"wait_s": 1.0, "compute_s": 8.0, "pack_s": 0.5, "forward_s": 3.0, "backward_s": 4.0, "optim_s": 0.5,
              "ckpt_s": 0.0, "publish_s": 1.0}
    write_rows(run / "trainer" / "metrics.jsonl", [{"step": s, "time": t, **phases} for s, t in times.items()])
    write_rows(run / "orchestrator" / "metrics.jsonl",
               [{"step": s, "time": t - 5, "rollouts": 128, "reward": 0.5, "collect_s": 7.0, "build_s": 0.5,
                 "send_s": 0.01, "wait_s": 2.0} for s, t in times.items()])


def test_a_resumed_run_is_reported_whole_and_says_it_was_resumed(tmp_path):
    resumed_run(tmp_path)
    s = write_report(tmp_path, wall_s=70.0)  # what the resumed rl alone measured
    assert s["wall_s"] == 470.0 and s["segments"] == [{"step": 0, "wall_s": 400.0}, {"step": 4, "wall_s": 70.0}]
    assert s["rollouts"] == 1024 and round(s["rollouts_per_s"], 4) == 2.1787  # 1024 / 70 = 14.6 was the bug
    assert round(s["trainer_busy_fraction"], 4) == 0.1362  # 64 s of compute in 470
    t = s["time_per_step"]  # steps 3, 5, 6, 7: each after a step of its own segment (4's gap spans the stop)
    assert (t["steps"], t["step_s"]) == (4, 10.0)  # (5060 - 1030) / 5 = 806 s was the bug
    assert "- wall time: 470 s in 2 segments, resumed at step 4 (400 + 70 s)\n" in (tmp_path / "report.md").read_text()


def test_a_segment_whose_rl_was_killed_ends_at_its_last_metrics_row(tmp_path):
    resumed_run(tmp_path)
    segments = report_segments.load(tmp_path)
    del segments[0]["end"]  # rl killed by SIGKILL: no end written
    (tmp_path / report_segments.FILE).write_text(json.dumps(segments))
    assert summarize(tmp_path)["segments"] == [{"step": 0, "wall_s": 40.0}, {"step": 4, "wall_s": 70.0}]


def test_a_run_in_one_go_reports_as_before_and_a_resume_without_a_record_gets_one_from_its_rows(tmp_path):
    report_segments.begin(tmp_path, None, "a", [], now=100.0)
    report_segments.end(tmp_path, now=160.0)
    s = summarize(tmp_path)
    assert (s["wall_s"], s["segments"]) == (60.0, [{"step": 0, "wall_s": 60.0}])
    legacy = tmp_path / "legacy"  # first run by an rl that kept no segments
    report_segments.begin(legacy, 20, "a", [130.0, 110.0, 150.0, 900.0], now=500.0)
    assert report_segments.load(legacy) == [{"start": 110.0, "step": 0, "run": "a", "end": 150.0},
                                            {"start": 500.0, "step": 20, "run": "a"}]

"""utils/report.py's volunteers line: the counts of a metrics row in words, as the step line, report.md and
`rl`'s done line give them (they were only in metrics.jsonl)."""

import json

from composer_prime.utils.report import hint_lift_line, time_breakdown, volunteers_line


def test_volunteers_counts_in_words_summed_over_nodes():
    row = {"step": 29, "reward": 0.5, "volunteers/healthy": 2, "volunteers/ejected": 1, "volunteers/refused/ejected": 6,
           "volunteers/aaaaaaaaaaaa/leased": 344, "volunteers/aaaaaaaaaaaa/accepted": 344, "volunteers/aaaaaaaaaaaa/in_batch": 32,
           "volunteers/bbbbbbbbbbbb/leased": 364, "volunteers/bbbbbbbbbbbb/accepted": 296,
           "volunteers/cccccccccccc/leased": 16, "volunteers/cccccccccccc/rejected:logprobs": 2,
           "volunteers/cccccccccccc/reassigned": 3}
    assert volunteers_line(row) == "volunteers 2 healthy, 1 ejected; 640 of 724 leases accepted, 2 rejected"
    assert volunteers_line({"step": 3, "reward": 0.1}) is None  # a run without volunteers says nothing of them


def write_rows(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_short_run_of_slow_steps_still_gets_its_time_breakdown(tmp_path):
    """Three steps of 20 s (SmolLM2 on the CPU): one start-up step skipped, not two (which left none, so
    report.md said nothing of where the time went); the step time from the rows' own clock."""
    phases = {"wait_s": 1.0, "compute_s": 18.0, "pack_s": 0.5, "forward_s": 6.0, "backward_s": 9.0, "optim_s": 1.5,
              "ckpt_s": 0.0, "publish_s": 1.0}
    write_rows(tmp_path / "trainer" / "metrics.jsonl", [{"step": s, "time": 100.0 + 20 * s, **phases} for s in range(3)])
    write_rows(tmp_path / "orchestrator" / "metrics.jsonl",
               [{"step": s, "time": 95.0 + 20 * s, "collect_s": 12.0, "build_s": 0.25, "send_s": 0.01, "wait_s": 7.0}
                for s in range(3)])
    t = time_breakdown(tmp_path)
    assert (t["steps"], t["skipped"], t["step_s"]) == (1, 2, 20.0)
    assert t["trainer"]["forward_s"] == 6.0 and t["trainer"]["other_compute_s"] == 1.0
    assert t["orchestrator"]["generate_and_score_s"] == 12.0
    write_rows(tmp_path / "trainer" / "metrics.jsonl", [{"step": 0, "time": 100.0, **phases}])
    assert time_breakdown(tmp_path) == {}  # one step: nothing to take a time between


def test_hint_lift_line_reads_the_runs_last_measurement():
    rows = [{"step": 0, "distill/hint_lift/parse": 0.1, "distill/hint_lift_lo/parse": -0.2, "distill/hint_lift_hi/parse": 0.3,
             "distill/hint_lift_sites/parse": 2.0},
            {"step": 1, "distill/hint_lift/parse": 0.5, "distill/hint_lift_lo/parse": 0.25, "distill/hint_lift_hi/parse": 0.75,
             "distill/hint_lift_sites/parse": 9.0, "distill/hint_lift/format": 0.0, "distill/hint_lift_lo/format": -0.125,
             "distill/hint_lift_hi/format": 0.125, "distill/hint_lift_sites/format": 8.0, "distill/gate/format": 0.0},
            {"step": 2, "reward": 0.3}]
    assert hint_lift_line(rows) == ("hint lift (distill/hint_lift, H [95% CI], sites): format +0.000 [-0.125, +0.125], 8 "
                                    "(gated off); parse +0.500 [+0.250, +0.750], 9")
    assert hint_lift_line([{"step": 0, "reward": 0.1}]) is None  # not measured: nothing said

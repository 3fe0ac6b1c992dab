"""benchmarks/hint_lift.py end to end at its smallest settings (tests/support/bench_runs.py): rollouts of the
model, its error turns drawn with and without the hint (and a placebo's, an oracle's), the table's JSON."""

from tests.support.bench_runs import run


def test_hint_lift(tmp_path):
    out = run("hint_lift", tmp_path)
    assert out["machine"] and out["commit"] and out["date"] and (out["model"], out["k"], out["placebo"]) == ("tiny", 2, "shuffle")
    rows = out["summary"]["tool-calc"]
    assert 1 <= rows["all"]["sites"] == len(out["sites"]) <= 2
    for row in rows.values():
        assert row["draws"] == 2 and row["lift"] == row["p_hint"] - row["p_plain"]
        assert row["lift_ci"][0] <= row["lift"] <= row["lift_ci"][1]
        assert {"placebo_lift", "oracle_lift", "gap_mean", "gap_min"} <= set(row)

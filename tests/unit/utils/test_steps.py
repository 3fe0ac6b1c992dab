"""Step directories (utils/steps.py), the one parser of `step_<N>` names: only complete steps (their
marker), numeric names only, in numeric order (step_10 after step_9), pruning that keeps the newest
and a protected one."""

from composer_prime.utils import steps


def test_steps_are_numeric_marked_and_pruned_newest_kept(tmp_path):
    for name in ("step_2", "step_10", "step_9", "step_3.tmp", "step_x", "step_4"):
        (tmp_path / name).mkdir()
    for name in ("step_2", "step_10", "step_9"):
        (tmp_path / name / "DONE").write_text("")
    (tmp_path / "step_7").write_text("a file, not a step")
    assert [s for s, _ in steps.steps(tmp_path)] == [2, 4, 9, 10]
    assert [s for s, _ in steps.steps(tmp_path, "DONE")] == [2, 9, 10]
    assert steps.latest(tmp_path, "DONE") == (10, tmp_path / "step_10") and steps.latest(tmp_path / "none") is None
    steps.prune(tmp_path, 1, "DONE", protect=2)
    assert [s for s, _ in steps.steps(tmp_path)] == [2, 4, 10]  # 9 gone; 2 protected; 4 (no marker) untouched
    steps.prune(tmp_path, 0)
    assert [s for s, _ in steps.steps(tmp_path)] == [2, 4, 10]

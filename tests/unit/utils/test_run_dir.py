"""A run directory knows which run wrote it (utils/run_dir.py, utils/steps.py; issue 46): pruning keeps the
current run's newest steps, never an older run's higher-numbered ones; a new run into a used directory is
one line unless --fresh, which deletes what a run resumes from and keeps keys and invites; --resume
continues only where the trainer's newest checkpoint, the orchestrator's and that step's weights agree.
The markers are written as the trainer and orchestrator write them (run_dir.save_orchestrator, DONE/STABLE
JSON); the rl runs that write them for real are tests/integration/test_run_dirs.py."""

import json

import pytest

from composer_prime.utils import run_dir, steps
from composer_prime.utils.run_dir import DONE, STABLE, RunDirError


def step(root, n: int, run: str | None, marker: str = DONE) -> None:
    d = root / f"step_{n}"
    d.mkdir(parents=True)
    (d / marker).write_text(json.dumps({"step": n} | ({"run": run} if run else {})))


def names(root) -> list[int]:
    return [s for s, _ in steps.steps(root)]


def test_pruning_keeps_the_current_runs_newest_and_deletes_an_older_runs_higher_steps(tmp_path):
    """The issue's directory: an older run's step_140 and step_150 beside the new run's step_10 and step_20.
    keep_last = 2 kept 140 and 150 and deleted the new run's own (the old prune kept the highest numbers)."""
    ckpts = tmp_path / "checkpoints"
    for n, run in ((140, "old"), (150, "old"), (10, "new"), (20, "new")):
        step(ckpts, n, run)
    steps.prune(ckpts, 2, DONE, run="new")
    assert names(ckpts) == [10, 20]
    step(ckpts, 30, "new")
    steps.prune(ckpts, 2, DONE, run="new")
    assert names(ckpts) == [20, 30]
    assert steps.latest(ckpts, DONE, "new") == (30, ckpts / "step_30")
    weights = tmp_path / "weights"  # the published steps: the newest checkpoint's is spared
    for n, run in ((150, "old"), (21, None), (29, "new"), (30, "new"), (31, "new")):
        step(weights, n, run, STABLE)
    steps.prune(weights, 1, STABLE, protect=30, run="new")
    assert names(weights) == [30, 31]  # another run's and one from before run ids go too
    assert steps.run_of(weights / "step_31", STABLE) == "new" and steps.run_of(ckpts / "none", DONE) is None


def test_a_new_run_into_a_used_directory_is_one_line_and_fresh_clears_what_a_run_resumes_from(tmp_path):
    step(tmp_path / "checkpoints", 150, "3fa2c1d0")
    with pytest.raises(RunDirError) as e:
        run_dir.check_new(tmp_path, fresh=False)
    assert str(e.value) == (f"{tmp_path} holds the checkpoints of another run (run 3fa2c1d0, newest step_150): continue it "
                            "with --resume, start over with --fresh (deletes its checkpoints, weights and metrics), or "
                            "choose another --output_dir")
    run_dir.check_new(tmp_path, fresh=True)  # cleared at launch
    run_dir.check_new(tmp_path / "unused", fresh=False)
    step(tmp_path / "weights", 150, "3fa2c1d0", STABLE)
    step(tmp_path / "inference-8000", 150, None, STABLE)  # a SHARDCAST follower's copy
    run_dir.save_orchestrator(tmp_path, "3fa2c1d0", 151)
    kept = ["keys/trainer.key", "orchestrator/invites.json", "logs/rl.log", "configs/trainer.toml"]
    for name in [*kept, "trainer/metrics.jsonl", "orchestrator/metrics.jsonl", "report.md", "segments.json"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert run_dir.clear(tmp_path) == ["checkpoints", "weights", "inference-8000", "trainer/metrics.jsonl",
                                       "orchestrator/metrics.jsonl", "orchestrator/checkpoint.json", "report.md",
                                       "segments.json"]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == sorted(kept)


def test_resume_continues_only_where_trainer_orchestrator_and_weights_agree(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for n in (10, 20):
        step(ckpts, n, "b")
    step(tmp_path / "weights", 20, "b", STABLE)
    run_dir.save_orchestrator(tmp_path, "b", 22)  # max_async_level 1: it made a batch or two past the checkpoint
    assert run_dir.check_resume(tmp_path, 50) == run_dir.Resume(20, tmp_path / "weights" / "step_20", "b")
    assert run_dir.check_resume(tmp_path / "empty", 50) is None  # nothing to resume: from step 0
    with pytest.raises(RunDirError, match=r"holds a finished run \(run b: checkpoints/step_20, max_steps 20\): nothing "
                                          r"to resume; raise --max_steps to train it further, or start over with --fresh$"):
        run_dir.check_resume(tmp_path, 20)  # the issue's `steps 150..150, done`, then an orchestrator waiting forever
    step(ckpts, 150, "a")  # an older run's checkpoint, newer by number
    with pytest.raises(RunDirError) as e:
        run_dir.check_resume(tmp_path, 200)
    assert str(e.value) == (f"--resume: {tmp_path}'s processes disagree: the orchestrator's checkpoint "
                            "(orchestrator/checkpoint.json: run b, step 22) and the trainer's newest (checkpoints/step_150, "
                            "which is run a's); delete checkpoints/step_150 to resume run b from its step_20, or start "
                            "over with --fresh")
    (ckpts / "step_150" / DONE).unlink()
    run_dir.save_orchestrator(tmp_path, "b", 15)  # behind the trainer's step_20: not this training's record
    with pytest.raises(RunDirError, match=r"\(checkpoints/step_20, which is ahead of it \(the orchestrator made batches up "
                                          r"to step 15\)\); delete checkpoints/step_20 to resume run b from its step_10"):
        run_dir.check_resume(tmp_path, 50)
    run_dir.save_orchestrator(tmp_path, "b", 21)
    (tmp_path / "weights" / "step_20" / STABLE).write_text(json.dumps({"step": 20, "run": "a"}))  # another run's
    with pytest.raises(RunDirError, match=r"weights/step_20 is run a's, its checkpoints/step_20 run b's: delete "
                                          r"weights/step_20 \(the trainer publishes it again"):
        run_dir.check_resume(tmp_path, 50)
    (tmp_path / "weights" / "step_20" / STABLE).unlink()  # no weights for the step: the trainer publishes them
    assert run_dir.check_resume(tmp_path, 50) == run_dir.Resume(20, None, "b")

"""A run directory knows which run wrote it (issue 46), with real `rl` runs of the quickstart (a few steps each, of
2 groups of 8 and 2 held-out tasks: what is asserted is the directory's bookkeeping, not the batches):

- a second run into a used output_dir is refused in one line before any process starts, and so is a
  `--resume` of a finished run (the issue's `steps 150..150, done`, then an orchestrator waiting forever);
- `--fresh` starts over there: the older run's checkpoints and weights are gone, the new run's kept;
- the issue's directory, an older run's higher-numbered checkpoint beside the new run's: `--resume` is
  refused in one line naming both and what to do, before any process starts; done as the line says, the
  resume continues the new run from its own checkpoint, keeps its checkpoints, and the report covers both
  segments and says it was resumed;
- `--seq_len 8`, shorter than every quickstart prompt: refused by --dry-run in one line.

Unit tests of the same checks on hand-made directories: tests/unit/utils/test_run_dir.py."""

import json
import shutil
import subprocess
import sys

from tests.conftest import ROOT, free_port
from tests.support import forkserver
from tests.support.rl_runs import log_tails, rows

RL = [sys.executable, "-m", "composer_prime.entrypoints.rl"]


def rl(run, *extra: str) -> subprocess.CompletedProcess:
    args = ["@", "configs/quickstart.toml", "--output_dir", str(run), "--inference.port", str(free_port()),
            "--transport.address", f"tcp://127.0.0.1:{free_port()}", "--orchestrator.eval.num_tasks", "2",
            "--orchestrator.eval.interval", "100", "--trainer.ckpt.interval", "1",
            "--orchestrator.batch_size", "16", *extra]  # 2 groups of 8: only the directory's bookkeeping is asserted
    return forkserver.run(RL + args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def markers(root, marker: str) -> dict[int, str | None]:
    """step -> the run its marker names."""
    return {int(p.parent.name[5:]): json.loads(p.read_text()).get("run") for p in sorted(root.glob(f"step_*/{marker}"))}


def refused(run, *extra: str) -> str:
    """The one line a refused `rl` prints; nothing started (no log written, no config rewritten)."""
    before = {p: p.stat().st_mtime_ns for p in [*run.glob("logs/*"), *run.glob("configs/*")]}
    r = rl(run, *extra)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stdout[-2000:] + r.stderr
    assert {p: p.stat().st_mtime_ns for p in [*run.glob("logs/*"), *run.glob("configs/*")]} == before
    return r.stderr.strip()


def test_a_used_run_directory_is_refused_fresh_starts_over_and_resume_continues_only_its_own_run(tmp_path):
    run = tmp_path / "run"
    first = rl(run, "--max_steps", "2")
    assert first.returncode == 0, first.stdout[-3000:] + log_tails(run)
    (old,) = set(markers(run / "checkpoints", "DONE").values())
    assert markers(run / "checkpoints", "DONE") == {1: old, 2: old} and markers(run / "weights", "STABLE")[2] == old
    shutil.copytree(run / "checkpoints" / "step_2", tmp_path / "old_step_2")

    assert refused(run, "--max_steps", "2") == (
        f"config error: {run} holds the checkpoints of another run (run {old}, newest step_2): continue it with "
        "--resume, start over with --fresh (deletes its checkpoints, weights and metrics), or choose another "
        "--output_dir (command line)")
    assert refused(run, "--max_steps", "2", "--resume") == (
        f"config error: --resume: {run} holds a finished run (run {old}: checkpoints/step_2, max_steps 2): nothing to "
        "resume; raise --max_steps to train it further, or start over with --fresh")

    second = rl(run, "--max_steps", "1", "--fresh")  # the second run, told to start over: the first's steps are gone
    assert second.returncode == 0, second.stdout[-3000:] + log_tails(run)
    (new,) = set(markers(run / "checkpoints", "DONE").values())
    assert new != old and markers(run / "checkpoints", "DONE") == {1: new}
    assert set(markers(run / "weights", "STABLE")) == {1} and json.loads((run / "orchestrator" / "checkpoint.json")
                                                                        .read_text()) == {"run": new, "step": 1}

    shutil.copytree(tmp_path / "old_step_2", run / "checkpoints" / "step_2")  # the older run's higher step
    assert refused(run, "--max_steps", "3", "--resume") == (
        f"config error: --resume: {run}'s processes disagree: the orchestrator's checkpoint (orchestrator/checkpoint."
        f"json: run {new}, step 1) and the trainer's newest (checkpoints/step_2, which is run {old}'s); delete "
        f"checkpoints/step_2 to resume run {new} from its step_1, or start over with --fresh")

    shutil.rmtree(run / "checkpoints" / "step_2")  # as the line says
    resumed = rl(run, "--max_steps", "3", "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + log_tails(run)
    assert f"[trainer] resumed from {run / 'checkpoints' / 'step_1'} (step 1)" in resumed.stdout
    assert markers(run / "checkpoints", "DONE") == {2: new, 3: new}  # keep_last 2 of this run's own
    assert [r["step"] for r in rows(run / "trainer" / "metrics.jsonl")] == [0, 1, 2]
    segments = json.loads((run / "segments.json").read_text())
    assert [(s["step"], s["run"]) for s in segments] == [(0, new), (1, new)]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["wall_s"] == sum(s["end"] - s["start"] for s in segments)  # both rl's, not the resumed one's alone
    assert "s in 2 segments, resumed at step 1 (" in (run / "report.md").read_text()


def test_a_seq_len_shorter_than_every_prompt_is_refused_by_the_dry_run(tmp_path):
    r = forkserver.run(RL + ["@", "configs/quickstart.toml", "--seq_len", "8", "--output_dir", str(tmp_path), "--dry-run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.strip() == ("config error: seq_len: 8 leaves no room for a completion: reverse-text's shortest prompt "
                                "is 34 tokens (of its 2000 train tasks), so every rollout would sample nothing; give "
                                "seq_len above 34 (command line)")
    assert not (tmp_path / "configs").exists()

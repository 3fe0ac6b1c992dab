"""The README's Feature Deletion sequence, run as a newcomer would (test_readme.py's way:
tests/support/readme_runs.py's SEQUENCES, each command as the README prints it, then the smallest
settings appended): build inflection's task set from PyPI, audit it with two attacks, rl on it.
The build is also the generator's test on a real PyPI sdist (moved here from the environment's
test_generate.py, which built the same three tasks again): its report, and a task as written scoring
0 broken and exactly 1.0 restored. (That the policy's tool calls run in the sandbox and the update has
a gradient is test_rl_feature_deletion.py's, with a policy taught to call them.) Split from
test_readme.py for its cost."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.readme_runs import rows, run_sequence


def test_feature_deletion(tmp_path):
    """README: build inflection's task set, audit it (every attack 0, stopped by its defence), then
    rl on it with the config as shipped: its train split trains, its held-out task evaluates."""
    gone = subprocess.run([sys.executable, "-c", "import inflection"], cwd=tmp_path, capture_output=True)
    assert gone.returncode != 0, "inflection must not be installed in this venv"
    # CI reaches PyPI (package registries are the one network it has): a failed download fails the test
    work = run_sequence("feature-deletion", tmp_path)
    built = work / "outputs" / "tasks" / "inflection"
    check_inflection_build(json.loads((built / "manifest.json").read_text()), built, tmp_path)
    audit = json.loads((work / "outputs" / "redteam.json").read_text())
    attacks = [r for r in audit["results"] if r["attack"] not in ("honest", "untouched")]
    assert audit["failures"] == 0 and len(attacks) == 2
    assert all(r["score"] == 0.0 and r["stopped_by"] for r in attacks)
    assert [r["score"] for r in audit["results"] if r["attack"] == "honest"] == [1.0]
    run = work / "outputs" / "feature-deletion"
    orch = rows(run / "orchestrator" / "metrics.jsonl")
    steps = [r for r in orch if "rollouts" in r]
    assert [r["rollouts"] for r in steps] == [8, 8]  # batch_size 8: the sandboxed rollouts were all scored
    assert all(0.0 <= r["env/feature-deletion/reward"] <= 1.0 for r in steps)
    assert [r for r in orch if "eval/feature-deletion/reward" in r]  # eval_args without taskset_dir found the set
    assert [r["step"] for r in rows(run / "trainer" / "metrics.jsonl")] == [0, 1]


def check_inflection_build(m: dict, out: Path, tmp_path: Path) -> None:
    """The generator on a real sdist: inflection 0.5.1's 455 tests, its 3 tasks (docs/environments.md),
    and the first task as written scoring as the gates saw it."""
    from feature_deletion.scoring import score_task

    r = m["report"]
    assert len(m["tasks"]) == r["accepted"] == 3  # docs/environments.md: inflection 0.5.1 gives 3 tasks
    assert m["source"]["kind"] == "sdist" and len(m["source"]["sha256"]) == 64
    assert r["tests_collected"] == 455 == r["tests_stable_passing"]
    assert r["candidates"] == r["accepted"] + sum(r["rejected"].values()) + r["not_evaluated"]
    assert r["evaluated"] + r["not_evaluated"] == r["passed_filters"]
    task = m["tasks"][0]
    assert task["pytest_args"][-1] == "test_inflection.py" and "test_inflection.py" in task["test_paths"]
    assert len(task["baseline_passing"]) == 455
    # The task as written scores as the gates saw it: 0 broken, exactly 1.0 with the solution.
    d = out / "tasks" / task["id"]
    assert not list(d.rglob("*.egg-info")) and not list(d.rglob("__pycache__"))
    assert score_task(d, d / "repo").reward == 0.0
    fixed = tmp_path / "fixed"
    shutil.copytree(d / "repo", fixed)
    shutil.copytree(d / "solution", fixed, dirs_exist_ok=True)
    assert score_task(d, fixed).reward == 1.0

"""The README's Feature Deletion sequence, run as a newcomer would (test_readme.py's way:
tests/support/readme_runs.py's SEQUENCES, each command as the README prints it, then the smallest
settings appended): build inflection's task set from PyPI, audit it with two attacks, rl on it.
(That the policy's tool calls run in the sandbox and the update has a gradient is
test_rl_feature_deletion.py's, with a policy taught to call them.) Split from test_readme.py for its cost."""

import json

from tests.support.readme_runs import rows, run_sequence


def test_feature_deletion(tmp_path):
    """README: build inflection's task set, audit it (every attack 0, stopped by its defence), then
    rl on it with the config as shipped: its train split trains, its held-out task evaluates."""
    work = run_sequence("feature-deletion", tmp_path)
    manifest = json.loads((work / "outputs" / "tasks" / "inflection" / "manifest.json").read_text())
    assert len(manifest["tasks"]) == 3  # docs/environments.md: inflection 0.5.1 gives 3 tasks
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

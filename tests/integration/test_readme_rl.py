"""The README's quickstart `rl` sequences and its `sft` one, run as a newcomer would (test_readme.py's
way: tests/support/readme_runs.py's SEQUENCES, each command as the README prints it, then the smallest
settings appended), asserting what the README claims of each in kind. Split from test_readme.py, whose
static checks say that every README command is run by some test, for its cost."""

import re

from tests.support.readme_runs import rows, run_sequence


def test_quickstart(tmp_path):
    work = run_sequence("quickstart", tmp_path)
    run = work / "outputs" / "quickstart"
    assert {"report.md", "summary.json", "reward.png"} <= {p.name for p in run.iterdir()}  # what the README says it writes
    evals = [r for r in rows(run / "orchestrator" / "metrics.jsonl") if "eval_reward" in r]
    assert evals[0]["step"] == 0 and evals[0]["eval_reward"] > 0.3  # the warm-started tiny model starts able (README: 0.507)
    assert [r["step"] for r in rows(run / "trainer" / "metrics.jsonl")] == [0, 1]


def test_mix(tmp_path):
    run = run_sequence("mix", tmp_path) / "outputs" / "mix"
    first = [r for r in rows(run / "orchestrator" / "metrics.jsonl") if "eval_reward" in r][0]
    assert {"eval/reverse-text/reward", "eval/tool-calc/reward"} <= set(first)


def test_sft(tmp_path):
    out = run_sequence("sft", tmp_path) / "outputs" / "sft"
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()


def test_shardcast(tmp_path):
    run = run_sequence("shardcast", tmp_path) / "outputs" / "quickstart"
    assert [r["step"] for r in rows(run / "trainer" / "metrics.jsonl")] == [0, 1]
    assert re.search(r"inference-1", " ".join(p.name for p in (run / "logs").iterdir()))  # two servers pulled the steps

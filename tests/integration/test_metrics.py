"""The metrics sink: JSONL rows, and the same numbers in a real (offline) Weights & Biases run."""

import json

from composer_prime.utils.metrics import MetricsLog
from tests.support.wandb_records import history, runs

WANDB = {"mode": "offline", "project": "composer-prime-test", "entity": None, "name": "t", "dir": None}


def test_rows_reach_the_jsonl_and_an_offline_wandb_run(tmp_path):
    rows = [{"step": s, "loss/rl": 0.25 - 0.125 * s, "grad_norm": 1.5 + s, "stale": s, "policy_versions": [s, s + 1],
             "done": True} for s in range(3)]
    sink = MetricsLog(tmp_path, "trainer", 0, WANDB, {"optim": {"lr": 1e-4}})
    for row in rows:
        sink.log(row)
    sink.close()
    assert [json.loads(ln) for ln in (tmp_path / "trainer" / "metrics.jsonl").read_text().splitlines()] == rows
    [run] = runs(tmp_path)  # default dir: the process's output_dir
    numbers = [{k: v for k, v in r.items() if k not in ("policy_versions", "done")} for r in rows]
    assert history(run) == numbers  # numbers only: lists and flags stay in the JSONL


def test_a_resumed_log_forgets_the_steps_it_will_redo(tmp_path):
    first = MetricsLog(tmp_path, "orchestrator")
    for s in range(5):
        first.log({"step": s, "reward": s / 10})
    again = MetricsLog(tmp_path, "orchestrator", resume_step=3)
    again.log({"step": 3, "reward": 0.0})
    again.rewind(1)  # the trainer restarted at step 1
    path = tmp_path / "orchestrator" / "metrics.jsonl"
    assert [json.loads(ln) for ln in path.read_text().splitlines()] == [{"step": 0, "reward": 0.0}]
    assert MetricsLog(tmp_path, "orchestrator").path.read_text() == ""  # a fresh start: a fresh file
    assert not (tmp_path / "wandb").exists()  # W&B only when configured

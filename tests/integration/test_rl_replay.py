"""`rl` with the `rl` and `dpo` channels: replayed preference pairs (here: reverse-text prompts,
the right reversal chosen over the letters left in order) go through `traces dataset` (the frozen
reference's log-probs) and `orchestrator.replay` into every batch of a real three-process run.
Every step's dpo loss is non-zero and the dpo accuracy (chosen preferred) rises."""

import json
import math
import subprocess
import sys

import pytest

from tests.conftest import ROOT, free_port
from tests.support.replay_support import reverse_text_dataset


def rows(path):
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def test_rl_with_replayed_pairs(tmp_path, tiny_model_dir):
    dataset = reverse_text_dataset(tmp_path)
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/quickstart.toml",
                        "--output_dir", str(run), "--max_steps", "8", "--inference.port", str(free_port()),
                        "--transport.address", f"tcp://127.0.0.1:{free_port()}", "--orchestrator.batch_size", "32",
                        "--orchestrator.eval.interval", "100", "--orchestrator.eval.num_tasks", "8",
                        "--orchestrator.replay.dataset", str(dataset), "--orchestrator.replay.pairs_per_step", "16",
                        "--trainer.optim.warmup_steps", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    trainer = rows(run / "trainer" / "metrics.jsonl")
    orch = [x for x in rows(run / "orchestrator" / "metrics.jsonl") if "replay/pairs" in x]
    assert [x["replay/pairs"] for x in orch] == [16.0] * 8  # 16 different pairs a step (12.5 steps per pass)
    assert all(t["loss/dpo"] > 0 for t in trainer) and sum("loss/rl" in t for t in trainer) >= 5  # rl: unless all flat
    # step 0: policy = reference, so every margin is 0 up to rounding and the loss is ln 2; then the policy learns
    assert trainer[0]["loss/dpo"] == pytest.approx(math.log(2), abs=1e-4), trainer[0]
    acc = [t["dpo/accuracy"] for t in trainer]
    assert min(acc[-4:]) >= 0.85, acc

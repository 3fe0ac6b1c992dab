"""`rl` with the `rl` and `dpo` channels: replayed preference pairs (here: reverse-text prompts,
the right reversal chosen over the letters left in order) go through `traces dataset` (the frozen
reference's log-probs) and `orchestrator.replay` into every batch of a real three-process run.
Every step's dpo loss is non-zero and the dpo accuracy (chosen preferred) rises. The reference is
the trainer's snapshot of the policy every 4 steps (`trainer.loss.dpo.reference = "recent"`, on the
trainer's FSDP path): at steps 0 and 4 it is the policy itself, so every margin is exactly 0."""

import json
import math
import sys

import pytest

from tests.conftest import ROOT, free_port
from tests.support import forkserver
from tests.support.replay_support import reverse_text_dataset


def rows(path):
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def test_rl_with_replayed_pairs(tmp_path, tiny_model_dir):
    dataset = reverse_text_dataset(tmp_path)
    run = tmp_path / "run"
    r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/quickstart.toml",
                        "--output_dir", str(run), "--max_steps", "8", "--inference.port", str(free_port()),
                        "--transport.address", f"tcp://127.0.0.1:{free_port()}", "--orchestrator.batch_size", "32",
                        "--orchestrator.eval.interval", "100", "--orchestrator.eval.num_tasks", "8",
                        "--orchestrator.replay.dataset", str(dataset), "--orchestrator.replay.pairs_per_step", "16",
                        "--trainer.optim.warmup_steps", "1", "--trainer.loss.dpo.reference", "recent",
                        "--trainer.loss.dpo.ref_every", "4"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    trainer = rows(run / "trainer" / "metrics.jsonl")
    orch = [x for x in rows(run / "orchestrator" / "metrics.jsonl") if "replay/pairs" in x]
    assert [x["replay/pairs"] for x in orch] == [16.0] * 8  # 16 different pairs a step (12.5 steps per pass)
    assert all(t["loss/dpo"] > 0 for t in trainer) and sum("loss/rl" in t for t in trainer) >= 5  # rl: unless all flat
    # steps 0 and 4: the snapshot is taken, policy = reference, every margin 0 (no pair counts as right) and
    # the loss ln 2; between them the policy learns away from the snapshot
    loss, acc = [t["loss/dpo"] for t in trainer], [t["dpo/accuracy"] for t in trainer]
    assert [loss[0], loss[4]] == pytest.approx([math.log(2)] * 2, abs=1e-6) and acc[0] == acc[4] == 0.0, (loss, acc)
    assert max(loss[1:4] + loss[5:]) < math.log(2) - 1e-3, loss
    learnt = acc[1:4] + acc[5:]  # margins over 1 to 3 steps of learning: measured 0.75 to 1.0
    assert min(learnt) > 0.5 and sum(learnt) / len(learnt) >= 0.8, acc

"""`uv run sft --objective dpo`: the dpo loss run alone on a pairs dataset. The model it writes
prefers the chosen reply on pairs it never trained on (held-out DPO loss below ln 2, most
margins positive), measured against the same frozen reference the dataset's log-probs came from."""

import json
import math
import re
import sys

import pytest
import torch
from datasets import load_from_disk
from transformers import AutoModelForCausalLM, AutoTokenizer

from composer_prime.traces.dataset import pair_logps
from composer_prime.config import ConfigError
from composer_prime.trainer.loss.dpo import dpo_loss
from tests.conftest import ROOT
from composer_prime.trainer.sft import metrics_path, read_jsonl, read_pairs
from tests.support import forkserver
from tests.support.replay_support import reverse_text_dataset


def held_out_loss_and_accuracy(model_dir, rows) -> tuple[float, float]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    losses, right = [], 0
    with torch.no_grad():
        for r in rows:
            seq = pair_logps(model, tok, r)
            margin = (seq["chosen"] - r["ref_chosen_logps"]) - (seq["rejected"] - r["ref_rejected_logps"])
            right += int(margin > 0)
            losses.append(float(dpo_loss(seq["chosen"], seq["rejected"], torch.tensor(r["ref_chosen_logps"]),
                                         torch.tensor(r["ref_rejected_logps"]), 0.1)))
    return sum(losses) / len(losses), right / len(rows)


def test_sft_dpo_prefers_chosen_on_unseen_pairs(tmp_path, tiny_model_dir):
    train = reverse_text_dataset(tmp_path / "train", n=120, seed=7)
    held = load_from_disk(str(reverse_text_dataset(tmp_path / "held", n=40, seed=8))).to_list()
    r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.sft", "--objective", "dpo", "--data", str(train),
                        "--model", "tiny", "--output_dir", str(tmp_path / "out"), "--max_steps", "12", "--batch_size", "8",
                        "--lr", "1e-4", "--warmup_steps", "1"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(ln) for ln in metrics_path(tmp_path / "out").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(12))
    # step 0: the policy is the reference the dataset was scored with (the trainer's dpo channel, its batched rows)
    assert rows[0]["loss/dpo"] == pytest.approx(math.log(2), abs=1e-6)
    before, acc_before = held_out_loss_and_accuracy(tiny_model_dir, held)
    assert abs(before - math.log(2)) < 1e-4  # the dataset's reference is the starting model
    after, acc_after = held_out_loss_and_accuracy(tmp_path / "out", held)
    assert after < before - 0.02 and acc_after > 0.8, (before, after, acc_before, acc_after)


def test_dpo_on_a_file_that_is_not_a_dataset_is_one_line(tmp_path, tiny_model_dir):
    """One process shows the command's refusal (exit 2, one line, nothing written); the other two refusals are
    `read_jsonl`'s and `read_pairs`' ConfigError, called here as `train` calls them before anything is written
    (the same one_line_errors turns each into that one line and exit 2)."""
    bad = tmp_path / "pairs.jsonl"
    bad.write_text('{"prompt": []}\n')
    r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.sft", "--objective", "dpo", "--data", str(bad),
                        "--model", "tiny", "--output_dir", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "not a dataset" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    from datasets import Dataset

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    dataset = tmp_path / "ds"
    Dataset.from_list([{"prompt": [], "chosen": [], "rejected": []}]).save_to_disk(str(dataset))
    with pytest.raises(ConfigError, match="train on it with --objective dpo"):
        read_jsonl(dataset, tok)  # `sft --data <pairs dataset>` without --objective dpo
    unrenderable = tmp_path / "ds2"
    Dataset.from_list([{"prompt": [], "chosen": [], "rejected": [], "ref_chosen_logps": -1.0, "ref_rejected_logps": -2.0}]
                      ).save_to_disk(str(unrenderable))
    with pytest.raises(ConfigError, match=re.escape(f"{unrenderable}: pair 0: cannot be rendered")) as e:
        read_pairs(unrenderable, tok)
    assert "\n" not in str(e.value)

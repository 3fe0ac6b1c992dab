"""`traces dataset`: pairs normalised (every drop counted by reason) and given the frozen
reference's log-probs, in TRL's conversational preference format. The real TRL DPOTrainer loads
the dataset and runs a step on it, and TRL's own reference pass over the same rows gives the
same log-probs as ours (the tokenisation of prompt and replies agrees)."""

import json
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from composer_prime.traces.dataset import normalise
from composer_prime.traces.ingest import ingest
from composer_prime.traces.pairs import make_pair
from composer_prime.traces.record import action, tool_call
from tests.conftest import ROOT
from tests.support import forkserver

FIX = action("I will fix it.", [])


@pytest.fixture(scope="module")
def pairs() -> list[dict]:
    steps, *_ = ingest([ROOT / "tests" / "fixtures" / "traces"])
    return [p for s in steps if (p := make_pair(s, {"a": FIX, "b": FIX}, {}))]


def test_normalise_drops_and_counts_by_reason(pairs, tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    empty = {**pairs[0], "chosen": [{"role": "assistant", "content": "  "}]}
    same = {**pairs[1], "rejected": pairs[1]["chosen"]}
    circular = {**pairs[2], "circular": True}
    call = {**pairs[3], "chosen": [{"role": "assistant", "content": None,
                                    "tool_calls": [tool_call("t", "calc", {"expr": "1 + 2"})]}]}
    rows, dropped = normalise([*pairs, pairs[4], empty, same, circular, call], tok, 1024, exclude_circular=True)
    assert dict(dropped) == {"duplicate": 1, "empty": 1, "identical": 1, "circular": 1}
    assert len(rows) == len(pairs) + 1 and rows[-1]["chosen"][0]["content"] == '<tool_call>{"name": "calc", "arguments": {"expr": "1 + 2"}}</tool_call>'
    short, cut = normalise(pairs, tok, 60, exclude_circular=False)
    assert dict(cut) == {"too_long": 9} and len(short) == 2  # only the two shortest chats fit in 60 tokens


def test_trl_dpo_trainer_trains_on_it_and_agrees_on_the_reference(pairs, tiny_model_dir, tmp_path):
    from datasets import load_from_disk
    from trl import DPOConfig, DPOTrainer

    pairs_file = tmp_path / "pairs.jsonl"
    pairs_file.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", "traces", "dataset", str(pairs_file),
                        "--model", str(tiny_model_dir), "--out", str(tmp_path / "ds")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    ds = load_from_disk(str(tmp_path / "ds"))
    assert len(ds) == len(pairs) and {"prompt", "chosen", "rejected", "ref_chosen_logps", "ref_rejected_logps"} <= set(ds.column_names)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    def trainer(dataset, precompute: bool) -> DPOTrainer:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        args = DPOConfig(output_dir=str(tmp_path / "trl"), max_steps=1, per_device_train_batch_size=2, report_to=[], bf16=False,
                         gradient_checkpointing=False, precompute_ref_log_probs=precompute, use_cpu=True, save_strategy="no")
        return DPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=tok)

    theirs = trainer(ds.remove_columns(["ref_chosen_logps", "ref_rejected_logps"]), precompute=True).train_dataset
    for side in ("chosen", "rejected"):
        assert theirs[f"ref_{side}_logps"] == pytest.approx(ds[f"ref_{side}_logps"], rel=1e-4)
    out = trainer(ds, precompute=False).train()  # the dataset as written, unchanged
    assert out.global_step == 1 and out.training_loss == pytest.approx(0.693147, abs=1e-4)  # policy = reference: ln 2


def test_bad_pairs_file_is_one_line(tmp_path, tiny_model_dir):
    for text in ("", "not json\n"):
        f = tmp_path / "p.jsonl"
        f.write_text(text)
        r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", "traces", "dataset", str(f),
                            "--model", str(tiny_model_dir), "--out", str(tmp_path / "ds")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "ds").exists()

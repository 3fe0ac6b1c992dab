"""`uv run sft`: the `ce` channel as its own entrypoint, learning on examples it never trained on."""

import json
import random
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from composer_prime.model.tiny import build_random
from composer_prime.model.tokenizer import build_tokenizer
from composer_prime.trainer.loss import token_logprobs
from composer_prime.model.warm_start import encode_example, pad_batch

from composer_prime.trainer.sft import metrics_path
from tests.conftest import ROOT
from tests.support import forkserver


def examples(rng: random.Random, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        seq = [rng.choice("abcdefgh") for _ in range(rng.randint(3, 6))]
        out.append({"messages": [{"role": "system", "content": "Reverse the letters."},
                                 {"role": "user", "content": " ".join(seq)},
                                 {"role": "assistant", "content": " ".join(reversed(seq))}]})
    return out


def answer_nll(model_dir, data: list[dict]) -> float:
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids, mask = pad_batch([encode_example(tok, d["messages"]) for d in data], tok.pad_token_id)
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:])
    return float(-(lp * mask[:, 1:]).sum() / mask[:, 1:].sum())


def test_sft_lowers_held_out_loss_from_a_random_start(tmp_path):
    start = tmp_path / "random"
    tok = build_tokenizer()
    build_random(tok, seed=3).save_pretrained(start)
    tok.save_pretrained(start)
    train, held_out = examples(random.Random(0), 256), examples(random.Random(1), 64)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(e) + "\n" for e in train))
    r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.sft", "--model", str(start), "--data",
                        str(tmp_path / "train.jsonl"), "--output_dir", str(tmp_path / "out"), "--max_steps", "60",
                        "--lr", "1e-3", "--warmup_steps", "10"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    # the trainer's step (trainer/train.py) ran every step: its metrics, its schedule (model/optim.py)
    rows = [json.loads(ln) for ln in metrics_path(tmp_path / "out").read_text().splitlines()]
    assert not [p.name for p in (tmp_path / "out").iterdir() if p.is_dir()]  # the model folder holds the model only
    assert [r["step"] for r in rows] == list(range(60)) and all(r["trained_tokens"] > 0 and r["grad_norm"] > 0 for r in rows)
    assert [r["lr"] for r in rows] == pytest.approx([1e-3 * min(1.0, (s + 1) / 10) for s in range(60)], rel=1e-12)
    before, after = answer_nll(start, held_out), answer_nll(tmp_path / "out", held_out)
    assert before > 5.0  # ~ln(512) for random weights
    assert after < before - 2.5, (before, after)


def test_malformed_example_names_the_line(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps(examples(random.Random(0), 1)[0]) + "\n" + '{"messages": [{"role": "user", "content": "x"}]}\n')
    r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.sft", "--data", str(data), "--output_dir",
                        str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and f"{data}:2: not a chat example" in r.stderr and "Traceback" not in r.stderr

"""`composer-prime model ...`: the tiny default and SmolLM2-135M, both without a model hub."""

import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import ROOT
from tests.support import forkserver


def cli(*args: str) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


def test_model_tiny_prints_the_cached_directory(tiny_model_dir):
    r = cli("model", "tiny")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tiny_model_dir)
    assert (tiny_model_dir / "READY").exists() and (tiny_model_dir / "model.safetensors").exists()


def test_missing_model_directory_is_one_line_exit_2():
    r = cli("model", "./no/such/model")
    assert r.returncode == 2
    assert r.stderr.strip() == "error: model directory not found: ./no/such/model"


def test_smollm2_converts_from_the_wheel_and_answers():
    r = cli("model", "smollm2-135m")
    assert r.returncode == 0, r.stderr
    path = r.stdout.strip()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008  # SmolLM2-135M, embeddings tied
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2? Answer with a number."}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    # A mis-converted checkpoint (wrong tensor order, dropped scales) answers with garbage.
    assert "4" in tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

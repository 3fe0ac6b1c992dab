"""`--model FILE.gguf`: a real model that reaches a node as one file, converted once into the cache.

The GGUF is written here from a random Llama with the tiny model's tokenizer
(tests/support/gguf_file.py, 1.9 MB, float32), so the conversion can be checked against the model
it came from: every weight equal, the same token ids, the same chat template. The real command
runs as a subprocess with the cache in the test's directory. Bad files (not a GGUF, cut short, an
architecture transformers cannot load, missing) are one line and exit code 2, also through `rl`'s
config check.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from composer_prime.model.tokenizer import build_tokenizer
from tests.conftest import ROOT
from tests.support import forkserver
from tests.support.bad_input import fill, listing, run_bad_input, scaffold
from tests.support.gguf_file import tiny_llama, write_gguf

CHAT = [{"role": "user", "content": "Reverse: a b c d"}, {"role": "assistant", "content": "d c b a"}]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """(the GGUF file, the model and tokenizer it was written from)."""
    tok = build_tokenizer()
    model = tiny_llama(tok)
    path = write_gguf(model, tok, tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")
    return path, model, tok


def model_cli(name: str, cache: Path) -> subprocess.CompletedProcess:
    r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", "model", name], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "COMPOSER_PRIME_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_a_gguf_file_converts_once_to_the_model_it_holds(source, tmp_path):
    path, model, tok = source
    r = model_cli(str(path), tmp_path / "cache")
    out = Path(r.stdout.strip())
    assert out.parent == tmp_path / "cache" / "models" / "gguf" and out.name.startswith("tiny-llama-")
    assert "converting" in r.stderr
    converted = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert type(converted).__name__ == "LlamaForCausalLM" and converted.config.tie_word_embeddings
    want, got = model.state_dict(), converted.state_dict()
    assert sorted(got) == sorted(want)
    # exact: float32 in, float32 out; a q/k row order left permuted (llama.cpp's rotary layout) differs here
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    tok2 = AutoTokenizer.from_pretrained(out)
    text = tok.apply_chat_template(CHAT, tokenize=False)
    assert tok2.apply_chat_template(CHAT, tokenize=False) == text
    assert tok2(text)["input_ids"] == tok(text)["input_ids"] and len(tok(text)["input_ids"]) > 10
    assert (tok2.eos_token, tok2.pad_token) == ("<|im_end|>", "<|endoftext|>")

    stamp = (out / "model.safetensors").stat().st_mtime_ns
    again = model_cli(str(path), tmp_path / "cache")  # the cache answers: no second conversion
    assert again.stdout == r.stdout and "converting" not in again.stderr
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp

    os.utime(path, ns=(stamp, stamp + 10**9))  # the file changed (as a newer copy would): converted again
    changed = model_cli(str(path), tmp_path / "cache")
    assert changed.stdout != r.stdout and "converting" in changed.stderr


@pytest.fixture
def bad_files(source, tmp_path) -> dict[str, str]:
    path, model, tok = source
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])  # header whole, tensors cut
    (tmp_path / "stub.gguf").write_bytes(data[:64])  # the header itself cut
    write_gguf(model, tok, tmp_path / "rwkv.gguf", arch="rwkv6")  # llama.cpp has it; transformers does not load it
    return {"cut": str(tmp_path / "cut.gguf"), "stub": str(tmp_path / "stub.gguf"),
            "rwkv": str(tmp_path / "rwkv.gguf")}


@pytest.mark.parametrize("module,args,expected", [
    ("composer_prime.entrypoints.cli", ["model", "{file}"],
     "error: {file} is not a GGUF file (it does not start with GGUF's magic bytes)$"),
    ("composer_prime.entrypoints.cli", ["model", "{cut}"],  # a tensor cut short: its data no longer fills its shape
     "error: {cut} is not a readable GGUF file, truncated or damaged (ValueError: cannot reshape array of size "),
    ("composer_prime.entrypoints.cli", ["model", "{stub}"], "error: {stub} is not a readable GGUF file, truncated or damaged ("),
    ("composer_prime.entrypoints.cli", ["model", "{rwkv}"],
     "error: {rwkv}: architecture 'rwkv6' cannot be loaded from GGUF by this transformers (it loads "),
    ("composer_prime.entrypoints.cli", ["model", "{tmp}/missing.gguf"], "error: GGUF file not found: {tmp}/missing.gguf$"),
    ("composer_prime.entrypoints.rl", ["--model", "{cut}", "--dry-run", "--output_dir", "{tmp}/out"],
     "config error: model: {cut} is not a readable GGUF file, truncated or damaged ("),
])
def test_a_bad_gguf_file_is_one_line(module, args, expected, bad_files, tmp_path, monkeypatch):
    subs = {**scaffold(tmp_path), **bad_files}
    before = listing(tmp_path)
    monkeypatch.setenv("COMPOSER_PRIME_CACHE", str(tmp_path / "cache"))  # run_bad_input passes the environment on
    run_bad_input(module, [fill(a, subs) for a in args], fill(expected, subs), timeout=300)
    assert listing(tmp_path) == before  # no cache entry, no run directory: refused before anything is made

"""A GGUF file that transformers' reader fails on is one line naming the file and transformers' version
(model/gguf.py, `convert`), not a traceback: on the GPU image's transformers 5.17 the tokenizer reader
raised AttributeError ('GGUFTokenizerSkeleton' object has no attribute 'bos_token_id') for a file with
an EOS and no BOS token, and `composer-prime model FILE.gguf` printed its traceback (seen 2026-11-27,
CPython 3.12.1 with PyPI's torch 2.11.0 and transformers 5.17.0 on the CPU)."""

import pytest
import transformers

from composer_prime.model import gguf


@pytest.mark.parametrize("error", [AttributeError("'GGUFTokenizerSkeleton' object has no attribute 'bos_token_id'"),
                                   TypeError("unhashable type: 'list'"), KeyError("tokenizer.ggml.tokens")])
def test_a_reader_failure_is_one_line(error, tmp_path, monkeypatch):
    def fails(*args, **kwargs):
        raise error
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fails)
    path = tmp_path / "model.gguf"
    with pytest.raises(ValueError) as e:
        gguf.convert(path, tmp_path / "out")
    said = str(e.value)
    assert said.startswith(f"{path} cannot be converted by transformers {transformers.__version__}: {type(error).__name__}: ")
    assert "\n" not in said and not (tmp_path / "out").exists()

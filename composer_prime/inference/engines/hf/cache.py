"""The embedded engine's KV cache: one static slot per (row, position), and the model calls over it.

Row r of the batch keeps the keys and values of its token at position j in slot j, in buffers
allocated once (per layer: rows x kv heads x max_model_len x head dim). So a decode step is the
same handful of tensor ops whatever the rows hold: write each row's new key at its own position,
attend over the first `w` slots under a mask `slot <= position`, and nothing is reallocated,
concatenated or moved: what a CUDA graph needs (graphs.py), and on the CPU no cache copy per step
either. Prefill runs the distinct prompts of newly admitted rows once, right-padded (causal
attention never lets a real token see the padding after it), and writes each prompt's keys into
every row that continues it: a group's completions share one prefill.

The attention function registered here handles the decode step's one query per row without
repeating the key/value heads for grouped-query attention (the query heads of one key/value head
are that head's queries), and hands prefill and scoring to transformers' SDPA attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTENTION = "composer_prime_slots"


def slot_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    if query.shape[2] == 1 and attention_mask is not None:  # a decode step: (rows, heads, 1, head dim)
        b, heads, _, dim = query.shape
        kv_heads = key.shape[1]
        # reshape, not view: CUDA's kernels hand over strided tensors that CPU kernels never make (SDPA's
        # efficient and flash kernels return (b, heads, q, dim) laid out as (b, q, heads, dim), which no
        # view can merge back into one heads axis). reshape is a view wherever the layout allows one.
        out = F.scaled_dot_product_attention(query.reshape(b, kv_heads, heads // kv_heads, dim), key, value,
                                             attn_mask=attention_mask, scale=scaling)
        return out.reshape(b, heads, 1, dim).transpose(1, 2), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


AttentionInterface.register(ATTENTION, slot_attention)


class SlotCache(Cache):
    """Static keys and values for `rows` sequences of up to `length` tokens, addressed by position."""

    def __init__(self, config, rows: int, length: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(layers=[])
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (rows, config.num_key_value_heads, length, dim)
        # One tensor per layer, written in place as it is (not through a view of a larger one): torch.compile
        # then updates it in place too, where a view's update became a copy of the whole cache every step.
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.row_ids = torch.arange(rows, device=device)
        self.prefilling = False
        self.dst = self.src = self.pos = None
        self.b = self.w = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self.prefilling:  # fresh prompts: store them in their rows and attend over themselves only
            width = key_states.shape[2]
            keys[self.dst, :, :width] = key_states[self.src]
            values[self.dst, :, :width] = value_states[self.src]
            return key_states, value_states
        rows = self.row_ids[: self.b]
        keys[rows, :, self.pos] = key_states[:, :, 0]
        values[rows, :, self.pos] = value_states[:, :, 0]
        return keys[: self.b, :, : self.w], values[: self.b, :, : self.w]

    def move(self, src: list[int], dst: list[int], width: int) -> None:
        """Copy rows `src` into rows `dst` (their first `width` slots): compaction after retirements."""
        s, d = (torch.tensor(rows, dtype=torch.long, device=self.row_ids.device) for rows in (src, dst))
        for t in (*self.keys, *self.values):
            t[d, :, :width] = t[s, :, :width]


class SlotModel:
    """A transformers causal LM over a `SlotCache`: prefill and decode step (to the last hidden
    states, which `head` turns into logits) and scoring."""

    def __init__(self, model: PreTrainedModel, rows: int, length: int) -> None:
        if model.config._attn_implementation != ATTENTION:
            raise ValueError(f"load the model with attn_implementation={ATTENTION!r}")
        self.model, self.device = model, model.device
        self.decoder, self.lm_head = model.get_decoder(), model.get_output_embeddings()
        self.vocab_size, self.hidden_size = model.config.vocab_size, model.config.hidden_size
        self.cache = SlotCache(model.config, rows, length, model.dtype, model.device)
        self.arange = torch.arange(length, device=model.device)
        self.mask_values = (torch.zeros((), dtype=model.dtype, device=model.device),
                            torch.full((), float("-inf"), dtype=model.dtype, device=model.device))
        self._check_head()

    def _check_head(self) -> None:
        """Prefill and decode compute logits as head(decoder(x)); refuse a model whose own forward does
        more (a soft cap, a logit scale), which would make our log-probs differ from the trainer's."""
        ids = torch.tensor([[1, 2, 3]], device=self.device) % self.vocab_size
        with torch.no_grad():
            ours = self.head(self.decoder(input_ids=ids).last_hidden_state)
            theirs = self.model(input_ids=ids).logits
        if not torch.allclose(ours.float(), theirs.float(), atol=1e-3, rtol=1e-3):
            raise NotImplementedError(f"{type(self.model).__name__}: its logits are not lm_head(decoder(x)); "
                                      "serve it with vLLM")

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of last hidden states."""
        return self.lm_head(hidden)

    def prefill(self, prompts: list[list[int]], dst: list[int], src: list[int]) -> torch.Tensor:
        """The last hidden state after each prompt's last token; prompt src[i]'s keys go to row dst[i]."""
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p)
        cache = self.cache
        cache.dst, cache.src = (torch.tensor(rows, dtype=torch.long, device=self.device) for rows in (dst, src))
        cache.prefilling = True
        try:
            hidden = self.decoder(input_ids=ids.to(self.device), position_ids=self.arange[None, :width].expand(len(prompts), -1),
                                  past_key_values=cache, use_cache=True).last_hidden_state
        finally:
            cache.prefilling = False
        last = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
        return hidden[torch.arange(len(prompts), device=self.device), last]

    def decode(self, tokens: torch.Tensor, pos: torch.Tensor, b: int, w: int) -> torch.Tensor:
        """The last hidden state after token[r] at position pos[r] for rows [0, b), attending over slots [0, w)."""
        cache = self.cache
        cache.b, cache.w, cache.pos = b, w, pos
        # additive (0 or -inf, the model's dtype), made once per step: a boolean mask is turned into this
        # by SDPA in every layer (three kernels a layer on each device)
        mask = torch.where(self.arange[None, :w] <= pos[:, None], *self.mask_values)[:, None, None, :]
        hidden = self.decoder(input_ids=tokens[:, None], position_ids=pos[:, None], attention_mask=mask,
                              past_key_values=cache, use_cache=True).last_hidden_state
        return hidden[:, 0]

    def move(self, src: list[int], dst: list[int], width: int) -> None:
        self.cache.move(src, dst, width)

    def score_logits(self, token_ids: list[int], keep: int) -> torch.Tensor:
        """The model's own forward over one sequence (no cache): logits of its last `keep` positions."""
        ids = torch.tensor([token_ids], device=self.device)
        return self.model(input_ids=ids, logits_to_keep=keep).logits[0]

    def states(self, token_ids: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over one sequence (no cache): the last hidden states (the LM head's input) and
        the logits at positions [start - 1, len - 1), i.e. those predicting token_ids[start:]."""
        ids = torch.tensor([token_ids[:-1]], device=self.device)
        hidden = self.decoder(input_ids=ids).last_hidden_state[0, start - 1:]
        return hidden, self.head(hidden)

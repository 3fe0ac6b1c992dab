"""Shared-prefix rows: which samples share a row, and that a row gives every sample exactly the
logits and gradients it gets alone, for both attention implementations that take a 4-D mask."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from composer_prime.contract.batches import Sample
from composer_prime.model.logprobs import token_logprobs
from composer_prime.trainer.data import collate, pack
from composer_prime.trainer.prefix import row_tokens, share


def sample(ids: list[int], weight_from: int) -> Sample:
    n = len(ids)
    return Sample(list(ids), [-0.7] * n, [0.5] * n, {"rl": [0.0] * weight_from + [1.0] * (n - weight_from)})


PROMPT_A, PROMPT_B = [5, 9, 2, 7, 7, 3], [5, 9, 4, 1]
GROUPS = [sample(PROMPT_A + c, 6) for c in ([11, 12, 13], [11, 14], [20, 21, 22, 23, 24], [11, 12, 13])] \
       + [sample(PROMPT_B + c, 4) for c in ([30], [31, 32, 33, 34, 35, 36, 37])] \
       + [sample([40, 41, 42], 1)]


def test_groups_share_their_longest_common_prefix():
    """Sorted, A's four come first: the shared prefix shrinks 8 -> 7 -> 6 as [11, 14] and [20, ...] join
    (each join still beats a row apart); B's first shares only [5, 9] with A (a row of 34 against 19 + 5
    apart), so it starts a row; C shares nothing."""
    groups = share(GROUPS, cap=64)
    assert [(len(g), p, row_tokens((g, p))) for g, p in groups] == [(4, 6, 19), (2, 4, 12), (1, 2, 3)]
    assert sum(len(s.input_ids) for s in GROUPS) == 56  # the tokens a forward without rows computes


def test_cap_and_disjoint_prompts_keep_samples_apart():
    # cap 12: [20, ...] would make A's row 19, so it starts its own; B's first cannot join it (a row of 14)
    assert [(len(g), p) for g, p in share(GROUPS, cap=12)] == [(3, 7), (1, 10), (2, 4), (1, 2)]
    apart = [sample([i] * 5, 1) for i in range(1, 4)]
    assert [(len(g), p) for g, p in share(apart, cap=100)] == [(1, 4)] * 3


def tiny(attn: str) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=64, attn_implementation=attn)
    return Qwen3ForCausalLM(cfg).float()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_rows_give_each_sample_its_own_logits_and_gradients(attn):
    model = tiny(attn)
    alone = collate(GROUPS, 0, ["rl"])
    rows = collate(GROUPS, 0, ["rl"], share_cap=64)
    assert alone.rows is None and rows.rows is not None
    assert rows.rows.input_ids.shape == (3, 19)  # 57 padded tokens, against 7 x 11 = 77
    # rows reorder the samples (group order); compare sample by sample
    order = [next(k for k, t in enumerate(GROUPS) if t is s) for g, _ in share(GROUPS, 64) for s in g]
    assert sorted(order) == list(range(len(GROUPS)))
    for i, j in enumerate(order):
        assert rows.input_ids[i].tolist() == alone.input_ids[j].tolist()
    grads = []
    for mb, perm in ((alone, list(range(len(GROUPS)))), (rows, order)):
        model.zero_grad()
        lp = token_logprobs(mb.logits(model), mb.input_ids[:, 1:], mb.temperature)
        w = mb.channel_weights["rl"]
        (lp * w).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        ordered = torch.zeros_like(lp)
        ordered[perm] = lp * w
        if mb is alone:
            ref = ordered
    assert torch.allclose(ordered, ref, atol=1e-5) and float(ref.detach().abs().sum()) > 1.0
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-4) and float(grads[0].abs().sum()) > 0


def test_pack_puts_a_group_in_one_micro_batch():
    ranks = pack(GROUPS, micro_batch_tokens=24, world_size=2, share_cap=24)
    # A's row (19) alone; B's (12) with C's (3): 2 x 12 <= 24; one micro-batch per rank
    assert [[len(mb) for mb in r] for r in ranks] == [[4], [3]]

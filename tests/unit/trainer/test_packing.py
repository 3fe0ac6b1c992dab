import torch

from composer_prime.contract.batches import Sample
from composer_prime.trainer.data import collate, pack


def sample(n: int, tag: int) -> Sample:
    return Sample(input_ids=[tag] * n, sampling_logprobs=[-0.5] * n, advantages=[float(tag)] * n,
                  channel_weights={"rl": [0.0] + [1.0] * (n - 1)})


def test_every_sample_lands_once_within_budget_and_ranks_are_even():
    samples = [sample(n, i) for i, n in enumerate([10, 3, 7, 7, 2, 9, 4, 4, 1 + 1])]
    ranks = pack(samples, micro_batch_tokens=20, world_size=2)
    assert len(ranks) == 2 and len(ranks[0]) == len(ranks[1])
    placed = [s.input_ids[0] for r in ranks for mb in r for s in mb]
    assert sorted(placed) == list(range(len(samples)))
    for r in ranks:
        for mb in r:
            if mb:
                assert len(mb) * max(len(s.input_ids) for s in mb) <= 20
    loads = [sum(len(s.input_ids) for mb in r for s in mb) for r in ranks]
    assert abs(loads[0] - loads[1]) <= 10


def test_collate_shifts_per_token_fields_to_predicted_tokens():
    mb = collate([sample(4, 3), sample(2, 5)], pad_id=0, channels=["rl"])
    assert mb.input_ids.tolist() == [[3, 3, 3, 3], [5, 5, 0, 0]]
    # position t of the shifted tensors describes input_ids[:, t + 1]
    assert mb.channel_weights["rl"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert mb.advantages.tolist() == [[3, 3, 3], [5, 0, 0]]
    assert mb.temperature.shape == (2, 1, 1)


def test_filler_micro_batch_has_zero_weight():
    mb = collate([], pad_id=0, channels=["rl", "ce"])
    assert all(float(w.abs().sum()) == 0 for w in mb.channel_weights.values())
    assert isinstance(mb.input_ids, torch.Tensor)

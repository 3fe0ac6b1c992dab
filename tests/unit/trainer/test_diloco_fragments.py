"""The model in P fragments for Streaming DiLoCo (trainer/diloco.fragments): strided puts decoder
layer i in fragment i mod P (the paper's better layout), sequential contiguous blocks; the
layers' outside (embeddings, final norm, the head) rides with fragment 0; every parameter is in
exactly one fragment (a tied head is the embedding: once); more fragments than layers is refused."""

import pytest

from composer_prime.config.diloco import DiLoCoConfig
from composer_prime.trainer.diloco import fragments, outer_optimizer
from composer_prime.trainer.model import load_model


def layers(model, fragment) -> list[int]:
    index = {id(m): i for i, m in enumerate(model.model.layers)}
    return [index[id(m)] for m in fragment if id(m) in index]


@pytest.mark.parametrize("layout,expected", [("strided", [[0, 2], [1, 3]]), ("sequential", [[0, 1], [2, 3]])])
def test_layouts(tiny_model_dir, layout, expected):
    model = load_model(str(tiny_model_dir))  # 4 decoder layers
    parts = fragments(model, 2, layout)
    assert [layers(model, p) for p in parts] == expected
    owned = [id(p) for part in parts for p in part.parameters()]
    assert sorted(owned) == sorted(id(p) for p in model.parameters())  # each parameter once, none left out
    outside = {id(p) for n, p in model.named_parameters() if ".layers." not in n}
    assert outside <= {id(p) for p in parts[0].parameters()}


def test_uneven_sequential_and_too_many(tiny_model_dir):
    model = load_model(str(tiny_model_dir))
    assert [layers(model, p) for p in fragments(model, 3, "sequential")] == [[0, 1], [2], [3]]
    assert [layers(model, p) for p in fragments(model, 3, "strided")] == [[0, 3], [1], [2]]
    with pytest.raises(SystemExit, match="5 is more than the model's 4 decoder layers"):
        fragments(model, 5, "strided")


def test_outer_momentum_starts_as_zeros_and_the_first_step_is_plain_sgd(tiny_model_dir):
    """Zeros rather than no buffer (a checkpoint before any sync has every key): the first Nesterov
    step is then p − lr·(Δ + 0.9·Δ), as with torch's own first step."""
    import torch

    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    sgd = outer_optimizer([p], DiLoCoConfig())
    assert torch.equal(sgd.state[p]["momentum_buffer"], torch.zeros(2))
    p.grad = torch.tensor([0.5, 0.25])
    sgd.step()
    torch.testing.assert_close(p.data, torch.tensor([1.0, -2.0]) - 0.7 * (1.9 * torch.tensor([0.5, 0.25])))

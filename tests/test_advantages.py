import pytest

from composer_prime.orchestrator.advantages import group_advantages, has_spread


def test_grpo_uses_sample_std():
    assert group_advantages([1, 0, 0, 0], "grpo") == pytest.approx([1.5, -0.5, -0.5, -0.5])


def test_drgrpo_is_mean_centred_only():
    assert group_advantages([1, 0, 0, 0], "drgrpo") == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_flat_group_has_zero_advantage_and_is_dropped():
    assert group_advantages([1, 1, 1, 1], "grpo") == [0.0] * 4
    assert not has_spread([1, 1, 1, 1]) and not has_spread([0, 0, 0, 0])
    assert has_spread([1, 0, 0, 0])


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="unknown advantage"):
        group_advantages([1, 0], "ppo")

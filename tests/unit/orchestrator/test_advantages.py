import pytest

from composer_prime.orchestrator.advantages import group_advantages, has_spread, overlong_penalty, shape_reward


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


@pytest.mark.parametrize("length, penalty", [(16, 0.0), (17, -0.25), (18, -0.5), (20, -1.0), (21, -1.0)])
def test_dapo_overlong_shaping(length, penalty):
    assert overlong_penalty(length, max_len=20, cache=4) == pytest.approx(penalty)


def test_shaping_adds_length_terms_to_the_reward():
    assert shape_reward(1.0, 18, overlong_max=20, overlong_cache=4, length_penalty=0.0, max_tokens=32) == pytest.approx(0.5)
    assert shape_reward(1.0, 8, overlong_max=0, overlong_cache=4, length_penalty=0.5, max_tokens=32) == pytest.approx(0.875)
    assert shape_reward(0.3, 30, overlong_max=0, overlong_cache=4, length_penalty=0.0, max_tokens=32) == 0.3  # all off

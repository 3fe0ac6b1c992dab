"""Batch building: the kept groups' rl samples, then the registered steps (a channel's
orchestrator side); why a batch is empty. Rollouts come from a scripted policy at the inference
seam; the tokenizer, environment, tool sessions, hints and teacher views are the real ones."""

import asyncio

import pytest

from composer_prime.orchestrator.orchestrator import Collected
from tests.support.scripted import RIGHT, WRONG, orchestrator, scripted

FORMAT = "The answer is 1660"  # a format error site (tool-calc's own rule)


def test_distill_step_adds_its_channel_to_batch_samples_and_flat_rollouts(tiny_model_dir):
    o = orchestrator(tiny_model_dir, distill={"enabled": True, "flat_groups": True, "only_failed": False})
    assert list(o.steps) == ["distill"]
    erring, clean = scripted(o, [WRONG, RIGHT, FORMAT]), scripted(o, [RIGHT, "1660"])
    flat = scripted(o, [WRONG, RIGHT, FORMAT])
    assert (len(erring.sites), len(clean.sites), erring.reward, clean.reward) == (2, 0, 0.0, 1.0)
    c = Collected(groups=[([erring, clean], [0.0, 1.0])], flat=[flat], seen={"tool-calc": [erring, clean, flat]})
    batch, info = asyncio.run(o.build(0, c))
    assert len(batch.samples) == 3  # two rl samples, then the flat rollout's distill-only sample
    error_tokens = sum(t.end - t.start for k, t in enumerate(erring.turns) if k in (0, 2))
    assert [sum(s.channel_weights.get("distill", [])) for s in batch.samples] == [error_tokens, 0, error_tokens]
    assert [sum(s.channel_weights["rl"]) > 0 for s in batch.samples] == [True, True, False]
    assert [len(s.channel_data.get("distill", [])) for s in batch.samples] == [2, 0, 2]
    assert {k: v for k, v in info.items() if k.startswith("distill/")} == {
        "distill/sites": 4, "distill/hinted": 4, "distill/no_hint": 0, "distill/template_misses": 0,
        "distill/unscored": 0, "distill/distill_only_samples": 1, "distill/hinted_frac": pytest.approx(2 / 3),
        "distill/tokens": 2 * error_tokens, "distill/gated": 0, "distill/not_failed": 0}
    assert info["empty_batch"] == 0 and info["truncated"] == 0 and info["rollouts"] == 3


def test_by_default_only_failed_samples_are_distilled_and_flat_groups_are_not(tiny_model_dir):
    """The orchestrator's half of the collapse guard: a sample that recovered after its error turn
    (advantage > 0) and a flat group's rollout get no teacher; the failed sample keeps both of its own."""
    o = orchestrator(tiny_model_dir, distill={"enabled": True})
    erring, recovered = scripted(o, [WRONG, RIGHT, FORMAT]), scripted(o, [WRONG, RIGHT, "1660"])
    flat = scripted(o, [WRONG, RIGHT, FORMAT])
    assert (len(erring.sites), len(recovered.sites), erring.reward, recovered.reward) == (2, 1, 0.0, 1.0)
    c = Collected(groups=[([erring, recovered], [0.0, 1.0])], flat=[flat], seen={"tool-calc": [erring, recovered, flat]})
    batch, info = asyncio.run(o.build(0, c))
    assert [len(s.channel_data.get("distill", [])) for s in batch.samples] == [2, 0]  # no distill-only sample
    assert (info["distill/sites"], info["distill/hinted"], info["distill/not_failed"]) == (3, 2, 1)


def test_an_empty_batch_records_why(tiny_model_dir):
    o = orchestrator(tiny_model_dir)
    assert o.steps == {}  # distill is off by default
    r = scripted(o, [RIGHT, "1660"])
    stale = Collected(seen={"tool-calc": [r, r]}, stats={"stale": 2, "flat_groups": 0, "groups": 1})
    batch, info = asyncio.run(o.build(0, stale))
    assert batch.samples == [] and (info["empty_batch"], info["stale"], info["truncated"]) == (1, 2, 0)
    # a group kept whose prompts fill seq_len: its samples are cut to no model token
    o.cfg.seq_len = len(r.prompt_ids)
    batch, info = asyncio.run(o.build(0, Collected(groups=[([r, r], [1.0, 0.0])], seen={"tool-calc": [r, r]})))
    assert len(batch.samples) == 2 and (info["empty_batch"], info["truncated"]) == (1, 2)


def test_a_step_from_outside_the_package_adds_whole_samples_and_its_metrics(tiny_model_dir):
    o = orchestrator(tiny_model_dir, plugins=["tests.plugins.pair_step:PairStep"], pairs={"pairs": 2})
    assert list(o.steps) == ["pairs"]  # distill is registered too, and off
    r = scripted(o, [RIGHT, "1660"])
    batch, info = asyncio.run(o.build(0, Collected(groups=[([r, r], [1.0, 0.0])], seen={"tool-calc": [r, r]})))
    assert [sorted(s.channel_weights) for s in batch.samples] == [["rl"], ["rl"], ["dpo"], ["dpo"]]
    assert [s.channel_data for s in batch.samples[2:]] == [{"dpo": {"pair": 0}}, {"dpo": {"pair": 1}}]
    assert info["pairs/added"] == 2
    with pytest.raises(ValueError, match="pairs.pairs"):  # its section is checked by its own Config
        orchestrator(tiny_model_dir, plugins=["tests.plugins.pair_step:PairStep"], pairs={"pairs": "two"})
    with pytest.raises(ValueError, match="pair\n  Extra inputs are not permitted"):  # a key no step claims
        orchestrator(tiny_model_dir, pair={"pairs": 2})

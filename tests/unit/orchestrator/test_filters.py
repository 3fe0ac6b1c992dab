"""The rollout-filter stage (orchestrator/filters/): staleness and dynamic sampling as the first two
registered filters, in order; collection asks them group by group before advantages, counts each
drop under the refusing filter's name, keeps flat groups aside, refills, and takes a filter it was
never told about the same way; volunteers' `unverified` filter drops a group with a rejected completion.
Groups come from a scripted policy at the group seam."""

import asyncio
import dataclasses

from composer_prime.orchestrator.filters import Filter
from composer_prime.orchestrator.filters.dynamic_sampling import DynamicSampling
from composer_prime.orchestrator.filters.staleness import Staleness
from tests.support.scripted import RIGHT, WRONG, orchestrator, scripted


def serve(o, groups):
    """Collection's group seam answers with these groups, in order."""
    queue = list(groups)

    async def group(env, task, size, seed):
        return queue.pop(0)

    o._group = group
    return queue


def test_staleness_then_dynamic_sampling_refill_and_count(tiny_model_dir):
    o = orchestrator(tiny_model_dir, batch_size=4, group_size=2, max_async_level=1)  # 2 groups a step
    assert [type(f) for f in o.filters] == [Staleness, DynamicSampling]
    right, wrong = scripted(o, [RIGHT, "1660"]), scripted(o, [WRONG, RIGHT, "1"])
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    assert right.nodes == wrong.nodes == ["scripted"]  # every rollout carries the node(s) that sampled its turns
    at = lambda r, v: dataclasses.replace(r, weight_version=v)  # noqa: E731
    stale, flat = [at(right, 1), at(wrong, 2)], [at(right, 3), at(right, 3)]  # for step 3: policy 1 is too old
    good = [at(right, 2), at(wrong, 3)]
    left = serve(o, [stale, flat, good, good])
    c = asyncio.run(o.collect(3))
    assert left == [] and [g for g, _ in c.groups] == [good, good]  # refilled once
    assert (c.stats["groups"], c.stats["stale"], c.stats["flat_groups"]) == (4, 2, 1)  # stale in rollouts, flat in groups
    assert c.flat == flat  # kept aside for the batch steps; the stale group is not
    [env_id] = c.seen
    assert c.stats[f"env/{env_id}/groups_in_batch"] == 2  # its whole share


def test_an_environment_flat_through_every_draw_counts_fewer_groups_in_the_batch(tiny_model_dir):
    o = orchestrator(tiny_model_dir, batch_size=4, group_size=2, max_async_level=1)  # 2 groups a step, 8 draws at most
    right, wrong = scripted(o, [RIGHT, "1660"]), scripted(o, [WRONG, RIGHT, "1"])
    left = serve(o, [[right, wrong]] + [[right, right]] * 8)  # one mixed group, then flat ones only
    c = asyncio.run(o.collect(0))
    [env_id] = c.seen
    assert left == [] and c.stats["flat_groups"] == 8 and c.stats[f"env/{env_id}/groups_in_batch"] == 1


def test_dynamic_sampling_off_and_a_third_filter_joining(tiny_model_dir):
    o = orchestrator(tiny_model_dir, batch_size=4, group_size=2, dynamic_sampling=False)
    assert [type(f) for f in o.filters] == [Staleness]

    class NoWrongAnswers(Filter):  # e.g. a volunteer's proof check: never named by collection
        name, order = "has_wrong", 30

        def keeps(self, step, group, shaped) -> bool:
            return min(r.reward for r in group) > 0

    o.filters.append(NoWrongAnswers(o.cfg))
    right, wrong = scripted(o, [RIGHT, "1660"]), scripted(o, [WRONG, RIGHT, "1"])
    flat, mixed = [right, right], [right, wrong]
    serve(o, [flat, mixed, flat])
    c = asyncio.run(o.collect(0))
    assert [g for g, _ in c.groups] == [flat, flat]  # flat groups kept without dynamic sampling
    assert (c.stats["has_wrong"], c.stats["flat_groups"], c.flat) == (1, 0, [])


def test_an_environment_flat_for_three_steps_in_a_row_is_warned_of_once_per_stretch(tiny_model_dir, caplog):
    o = orchestrator(tiny_model_dir, batch_size=4, group_size=2)
    [env] = [e.cfg.id for e in o.envs]
    step = lambda kept: o.warn_if_flat({f"env/{env}/groups_in_batch": kept, f"env/{env}/reward": 0.0})  # noqa: E731
    with caplog.at_level("WARNING", logger="composer_prime.orchestrator.orchestrator"):
        for kept in (0, 0, 1, 0, 0, 0, 0, 0):  # flat 2, a group, then flat 5: warned at the 3rd of those
            step(kept)
        assert [r.getMessage().split(":")[0] for r in caplog.records] == [env]
        step(2)
        for _ in range(3):
            step(0)
        assert len(caplog.records) == 2  # a new stretch, said again


def test_a_group_with_a_completion_the_validator_rejected_is_dropped_counted_in_rollouts(tiny_model_dir):
    """The `unverified` filter (volunteers' runs): first, so a rejected rollout is never counted as merely stale.
    test_rl_volunteers.py's cheat, waited for, is rejected in the run's first held-out evaluation: this is where the
    filter's drop in a batch is shown."""
    from composer_prime.orchestrator.filters.volunteers import Unverified

    o = orchestrator(tiny_model_dir, batch_size=4, group_size=2, dynamic_sampling=False)
    o.filters.insert(0, Unverified(o.cfg))
    right, wrong = scripted(o, [RIGHT, "1660"]), scripted(o, [WRONG, RIGHT, "1"])
    rejected = dataclasses.replace(right, unverified=["volunteer:3f2a9c1b4d5e: rejected:logprobs"])
    serve(o, [[wrong, rejected], [right, wrong], [right, right]])
    c = asyncio.run(o.collect(0))
    assert [g for g, _ in c.groups] == [[right, wrong], [right, right]] and c.stats["unverified"] == 2


def test_a_held_out_completion_the_validator_rejected_counts_in_no_measure(tiny_model_dir):
    """A cheat's rejected completion in the held-out evaluation (the volunteers' run sends held-out requests to
    whichever node is next, as it does training ones): left out of the reward (it was in the mean: 0.5 here) and counted."""
    o = orchestrator(tiny_model_dir, batch_size=4, group_size=2)
    right, wrong = scripted(o, [RIGHT, "1660"]), scripted(o, [WRONG, RIGHT, "1"])
    cheat = dataclasses.replace(wrong, unverified=["volunteer:3f2a9c1b4d5e: rejected:logprobs"])
    serve(o, [[right, cheat]])

    async def versions():
        return [3]

    o.client.versions = versions
    row, version = asyncio.run(o.evaluate())
    assert version == 3 and row["eval/tool-calc/reward"] == 1.0 and row["eval/tool-calc/unverified"] == 1
    assert row["eval/tool-calc/dropped"] == 0 and row["eval_reward"] == 1.0

"""The loss channels' data on arrival, checked by the contract without a model: distill's teacher
views and dpo's pair rows. (The channels' math on the same data: tests/unit/trainer/.)"""

from dataclasses import asdict

import pytest

from composer_prime.contract.batches import Sample, SchemaError
from composer_prime.contract.distill import Teacher, teacher_views
from composer_prime.contract.dpo import PairRow, check_pairs, check_row

IDS = [5, 6, 7, 8, 9]  # the student: prompt 5 6, error turn 7 8 9
HINTED = [5, 6, 40, 41, 7, 8, 9]  # the teacher: a two-token hint before the turn


def distill_sample(views: list, weights: list[float] | None = None) -> Sample:
    n = len(IDS)
    return Sample(IDS, [0.0] * n, [0.0] * n, {"distill": weights or [0, 0, 1, 1, 1]}, channel_data={"distill": views})


def test_teacher_views_come_off_the_wire_as_views():
    t = Teacher(HINTED, start=4, student_start=2, length=3, top_ids=[[7, 1]] * 3, top_logprobs=[[-0.1, -2.3]] * 3)
    assert teacher_views(distill_sample([asdict(t)])) == [t]


@pytest.mark.parametrize("view,weights,error", [
    ({"input_ids": HINTED, "start": 4, "student_start": 2}, None, "missing 1 required positional argument: 'length'"),
    (asdict(Teacher(HINTED, 3, 2, 3)), None, "its tokens 3..6 are not the student's 2..5"),  # off by one
    (asdict(Teacher(HINTED, 4, 2, 4)), None, "its tokens 4..8 are not the student's 2..6"),  # past the end
    (asdict(Teacher(HINTED, 4, 2, 3, top_ids=[[7]] * 2, top_logprobs=[[-0.1]] * 2)), None, "one row per position (3)"),
    (asdict(Teacher(HINTED, 4, 2, 2)), None, "distill weight on tokens without a teacher: [4]"),
])
def test_a_bad_teacher_view_is_refused(view, weights, error):
    with pytest.raises(SchemaError) as e:
        teacher_views(distill_sample([view], weights))
    assert error in str(e.value)


def pair_row(pair: str, chosen: bool, ref_logp: float = -3.5, weights: list[float] | None = None) -> Sample:
    return Sample([1, 2, 3], [0.0] * 3, [0.0] * 3, {"dpo": weights or [0.0, 1.0, 1.0]},
                  channel_data={"dpo": PairRow(pair=pair, chosen=chosen, ref_logp=ref_logp)})


def test_a_whole_pair_passes():
    rows = [pair_row("p0", True), pair_row("p0", False)]
    for r in rows:
        check_row(r)
    check_pairs(rows)


@pytest.mark.parametrize("row,error", [
    (pair_row("p0", True, ref_logp=0.5), "ref_logp must be a finite log-prob (<= 0), got 0.5"),
    (pair_row("p0", True, weights=[0.0, 1.0, 0.5]), "one weight per row (the pair's), got several"),
    (Sample([1], [0.0], [0.0], {"dpo": [1.0]}, channel_data={"dpo": {"pair": 3, "chosen": True}}),
     "dpo data must be {pair: str, chosen: bool, ref_logp: float}"),
])
def test_a_bad_pair_row_is_refused(row, error):
    with pytest.raises(SchemaError) as e:
        check_row(row)
    assert error in str(e.value)


def test_a_pair_needs_one_row_of_each_side_of_equal_weight():
    with pytest.raises(SchemaError, match=r"pair p0: needs one chosen and one rejected row of equal weight, "
                                          r"got \[\(True, 1.0\), \(True, 1.0\)\]"):
        check_pairs([pair_row("p0", True), pair_row("p0", True)])
    with pytest.raises(SchemaError, match=r"got \[\(True, 1.0\), \(False, 2.0\)\]"):
        check_pairs([pair_row("p0", True), pair_row("p0", False, weights=[0.0, 2.0, 2.0])])

"""Hint lift (orchestrator/hint_lift.py), its placebo and oracle hints (hint_arms.py) and the gate.

Draws come from hand-made policies (a function of the context and the seed), and each is scored by
tool-calc's real turn check (its schema, its tool, its format rule), so every number is known."""

import asyncio
import json

import pytest

from composer_prime.env_runtime.error_sites import ErrorSite
from composer_prime.env_runtime.tasksets import load_tasks
from composer_prime.orchestrator.hint_arms import BLANK, PlaceboHinter, other_kind, shuffled
from composer_prime.orchestrator.hint_lift import (LiftGate, LiftTracker, SiteDraws, bootstrap, draw_site, lift,
                                                   summarise, turn_valid)
from composer_prime.orchestrator.hints import HintContext, OracleHinter, make_hinter
from composer_prime.orchestrator.orchestrator import Collected
from tests.support.scripted import RIGHT, WRONG, orchestrator, scripted

K = 16
PLAIN, HINTED, PLACEBO = [1], [2], [3]  # three contexts, told apart by their ids


@pytest.fixture(scope="module")
def task():
    return load_tasks("tool-calc", {"num_tasks": 1})[0]  # "874 + 786" = 1660


def check_for(task):
    async def check(text: str, finish: str) -> bool:
        session = await task.open_session()
        return await turn_valid(text, finish, session.tools, session, task.error_rules)
    return check


@pytest.mark.parametrize("text,finish,valid", [
    (RIGHT, "stop", True), ("1660", "stop", True),
    (WRONG, "stop", False),  # unknown tool
    ('<tool_call>{"name": "calc", "arguments": {"expression": "874 + 786"}}</tool_call>', "stop", False),  # schema
    ('<tool_call>{"name": "calc", "arguments": {"expr": "874 plus 786"}}</tool_call>', "stop", False),  # the tool's error
    ('<tool_call>{"name": "calc"', "stop", False),  # does not parse
    ("The answer is 1660", "stop", False),  # tool-calc's own format rule
    (RIGHT, "length", False),  # cut by its budget
])
def test_the_turn_check_is_the_environments_own(task, text, finish, valid):
    assert asyncio.run(check_for(task)(text, finish)) is valid


def test_a_teacher_that_always_fixes_the_turn_lifts_by_one_minus_the_students_rate(task):
    """Plain: right on 4 of 16 seeds (P = 0.25); hinted: always right, so H = 1 - 0.25 = 0.75. The
    placebo context behaves as the plain one: its lift is 0."""
    async def draw(ids, seed):
        return (RIGHT if ids == HINTED or seed % 4 == 0 else WRONG), "stop"

    site = asyncio.run(draw_site("tool-calc", "unknown_tool", PLAIN, HINTED, draw, check_for(task), range(K), PLACEBO))
    assert (sum(site.hint), sum(site.plain), sum(site.placebo)) == (16, 4, 4)
    assert lift([site]) == 0.75 == 1 - sum(site.plain) / K
    assert lift([site], "placebo") == 0.0


def sites(lifts_plain: list[tuple[int, int]], kind: str = "parse") -> list[SiteDraws]:
    """Sites with (valid hinted draws, valid plain draws) of K each; the placebo as the plain."""
    def bools(n: int) -> list[bool]:
        return [True] * n + [False] * (K - n)
    return [SiteDraws("tool-calc", kind, bools(h), bools(p), bools(p)) for h, p in lifts_plain]


def test_bootstrap_resamples_sites():
    """Two sites, lifts 1 and 0: a resample is {1, 1}, {1, 0} or {0, 0} (means 1, 0.5, 0 with
    probabilities 1/4, 1/2, 1/4), so the 95% interval is [0, 1]; one site has no spread at all."""
    assert bootstrap(sites([(16, 0), (0, 0)]), lift) == (0.0, 1.0)
    assert bootstrap(sites([(12, 4)]), lift) == (0.5, 0.5)


def test_summary_per_kind_with_placebo_and_intervals():
    draws = sites([(16, 4), (12, 4), (16, 8), (14, 2)]) + sites([(4, 4), (8, 8), (0, 0)], kind="format")
    table = summarise(draws, n_boot=500)["tool-calc"]
    parse, fmt = table["parse"], table["format"]
    assert parse["lift"] == pytest.approx((58 - 18) / 64) and parse["lift_ci"][0] > 0  # informative: the gate opens
    assert parse["placebo_lift"] == 0.0 and parse["placebo_ci"] == [0.0, 0.0]
    assert fmt["lift"] == 0.0 and fmt["lift_ci"] == [0.0, 0.0]
    assert table["all"]["sites"] == 7 and table["all"]["p_plain"] == pytest.approx(30 / 112)
    gate = LiftGate.from_result(json.loads(json.dumps({"summary": {"tool-calc": table}})), "tool-calc")
    assert (gate.open("parse"), gate.open("format"), gate.open("unknown_tool")) == (True, False, True)


def test_the_run_tracker_judges_a_kind_once_it_has_enough_sites():
    tracker = LiftTracker()
    gate = LiftGate({"parse": (0.1, 0.4)}, tracker, min_sites=3)
    for s in sites([(4, 4), (8, 8)]):
        tracker.add(s)
    assert gate.open("parse")  # 2 sites of its own: the measured interval still rules
    tracker.add(sites([(0, 0)])[0])
    assert not gate.open("parse")  # 3 sites, lift 0 in every resample
    assert tracker.metrics() == {"hint_lift/parse": 0.0, "hint_lift_lo/parse": 0.0, "hint_lift_hi/parse": 0.0,
                                 "hint_lift_sites/parse": 3.0}


def test_the_gate_turns_a_zero_lift_kind_off_in_the_distill_step(tiny_model_dir, tmp_path):
    """format's measured lift is [-0.05, 0.1] (contains 0): its error turn gets no teacher; the
    unknown_tool turn of the same rollout keeps its own."""
    result = {"summary": {"tool-calc": {"unknown_tool": {"lift_ci": [0.3, 0.6]}, "format": {"lift_ci": [-0.05, 0.1]}}}}
    (tmp_path / "lift.json").write_text(json.dumps(result))
    o = orchestrator(tiny_model_dir, distill={"enabled": True, "gate": {"enabled": True, "lift_file": str(tmp_path / "lift.json")}})
    erring, clean = scripted(o, [WRONG, RIGHT, "The answer is 1660"]), scripted(o, [RIGHT, "1660"])
    batch, info = asyncio.run(o.build(0, Collected(groups=[([erring, clean], [0.0, 1.0])], seen={"tool-calc": [erring, clean]})))
    views = batch.samples[0].channel_data["distill"]
    assert len(views) == 1 and views[0]["student_start"] == len(erring.prompt_ids) + erring.turns[0].start
    assert (info["distill/sites"], info["distill/hinted"], info["distill/gated"]) == (2, 1, 1)
    assert (info["distill/gate/format"], info["distill/gate/unknown_tool"]) == (0.0, 1.0)


UNKNOWN = ErrorSite(0, "unknown_tool", "unknown tool 'calculator'; the tools are: calc", "calculator")


def test_placebo_hints_keep_the_words_or_change_the_kind(task):
    ctx = HintContext([{"role": "user", "content": "874 + 786"}], WRONG, [], task)
    real = asyncio.run(make_hinter(["env"], {}, None, None, 1.0, None)(UNKNOWN, ctx))
    placebo = asyncio.run(PlaceboHinter(make_hinter(["env"], {}, None, None, 1.0, None), "shuffle")(UNKNOWN, ctx))
    assert placebo != real and sorted(placebo.split()) == sorted(real.split()) and placebo == shuffled(real)
    assert other_kind("unknown_tool") == "bad_arguments" and other_kind("format") == "parse" and other_kind("x") == "parse"
    other = asyncio.run(PlaceboHinter(make_hinter(["template"], {}, None, None, 1.0, None), "other_kind")(UNKNOWN, ctx))
    assert other.startswith("The arguments of `calculator` are wrong")
    # the words without the call every tool-calc hint quotes (which shuffling and another kind's hint both keep)
    words = asyncio.run(PlaceboHinter(make_hinter(["env"], {}, None, None, 1.0, None), "words_only")(UNKNOWN, ctx))
    assert "<tool_call>" in real and words == "The only tool is `calc`, not `calculator`:"
    assert asyncio.run(PlaceboHinter(make_hinter(["env"], {}, None, None, 1.0, None), "blank")(UNKNOWN, ctx)) == BLANK


def test_the_oracle_hint_is_the_correct_turn(task):
    before = HintContext([{"role": "user", "content": "874 + 786"}], WRONG, [], task)
    after = HintContext([{"role": "tool", "content": "1660"}], "The answer is 1660", [], task)
    assert asyncio.run(OracleHinter()(UNKNOWN, before)) == f"Use the tool as shown: {RIGHT}"
    assert asyncio.run(OracleHinter()(ErrorSite(1, "format", "x"), after)) == "Reply with exactly: 1660"


class HintFollower:
    """The inference seam of the lift's draws: "1660" (a valid final reply) from a context holding a
    hint that names `calc`, "The answer is 1660" (tool-calc's format error) from any other."""

    def __init__(self, tok) -> None:
        self.tok, self.prompts = tok, []

    async def generate(self, prompt_ids, params):
        from composer_prime.contract.inference import Completion

        self.prompts.append(params.seed)
        text = "1660" if "`calc`" in self.tok.decode(prompt_ids) else "The answer is 1660"
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        return Completion(ids, [-0.5] * len(ids), "stop", 0, "fake")


def test_the_run_metric_draws_each_hinted_turn_with_and_without_its_hint(tiny_model_dir):
    o = orchestrator(tiny_model_dir, distill={"enabled": True, "lift_samples": 3})
    erring, clean = scripted(o, [WRONG, RIGHT, "The answer is 1660"]), scripted(o, [RIGHT, "1660"])
    o.steps["distill"].distiller.sampler.client = follower = HintFollower(o.tok)
    batch, info = asyncio.run(o.build(0, Collected(groups=[([erring, clean], [0.0, 1.0])], seen={"tool-calc": [erring, clean]})))
    assert len(follower.prompts) == 2 * 2 * 3  # 2 sites x (hinted, plain) x 3 seeds
    # the unknown_tool hint names `calc`: always valid with it, never without (H = 1); the format hint
    # ("Reply with the number only: 1660") does not, so the follower errs either way (H = 0)
    assert (info["distill/hint_lift/unknown_tool"], info["distill/hint_lift/format"]) == (1.0, 0.0)
    assert info["distill/hint_lift_sites/unknown_tool"] == info["distill/hint_lift_sites/format"] == 1.0

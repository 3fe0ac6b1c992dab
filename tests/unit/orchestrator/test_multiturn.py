"""Multi-turn rollouts: tool calls parsed and run, token ids appended (never re-tokenised), masks.

The policy here is a scripted client at the inference seam (it returns the token ids of fixed
replies), so each test knows exactly which tokens the model produced; the tokenizer, chat
template, environment, tool session and scoring are the real ones.
"""

import asyncio

import pytest
from transformers import AutoTokenizer

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Completion
from composer_prime.env_runtime.error_sites import ErrorSite
from composer_prime.env_runtime.tasksets import load_tasks
from composer_prime.env_runtime.tool_calls import parse_tool_call
from composer_prime.orchestrator.distill import DistillConfig, Distiller, DistillStats, distill_only, with_teachers
from composer_prime.orchestrator.rollouts import rollout
from composer_prime.utils.chat import encode_chat
from tests.support.scripted import RIGHT, WRONG, ScriptedPolicy


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def task():
    return load_tasks("tool-calc", {"num_tasks": 1})[0]  # "874 + 786" = 1660


def run(tok, task, replies, max_turns=8, seq_len=512):
    policy = ScriptedPolicy(tok, replies)
    r = asyncio.run(rollout(policy, tok, "tool-calc", task, SamplingParams(max_tokens=128), seq_len, max_turns, 5,
                            asyncio.Semaphore(1)))
    return r, policy




def test_conversation_tokens_are_the_template_rendering_and_only_model_tokens_train(tok, task):
    r, policy = run(tok, task, [WRONG, RIGHT, "1660"])
    assert r.reward == 1.0 and r.metrics == {"calc_ok": 1.0, "turns": 3.0, "tool_calls": 2.0, "tool_errors": 1.0,
                                             "error_sites": 1.0, "sites/parse": 0.0, "sites/unknown_tool": 1.0,
                                             "sites/bad_arguments": 0.0, "sites/tool_error": 0.0, "sites/format": 0.0}
    assert [t.error for t in r.turns] == ["unknown tool 'calculator': the only tool is 'calc'", None, None]
    conversation = [{"role": "system", "content": task.data.system_prompt}, {"role": "user", "content": task.data.prompt},
                    {"role": "assistant", "content": WRONG},
                    {"role": "tool", "content": "error: unknown tool 'calculator': the only tool is 'calc'"},
                    {"role": "assistant", "content": RIGHT}, {"role": "tool", "content": "1660"},
                    {"role": "assistant", "content": "1660"}]
    ids = r.prompt_ids + r.completion_ids
    assert ids == encode_chat(tok, conversation, add_generation_prompt=False)[:-1]  # all but the template's final "\n"
    # each turn was generated from exactly the tokens so far: append-only, nothing re-tokenised
    assert [len(p) for p in policy.prompts] == [len(r.prompt_ids) + t.start for t in r.turns]
    assert all(ids[: len(p)] == p for p in policy.prompts)
    model = [len(tok.encode(x, add_special_tokens=False)) + 1 for x in (WRONG, RIGHT, "1660")]
    assert r.model_tokens == sum(model) and [t.end - t.start for t in r.turns] == model
    sample = r.to_sample(advantage=2.0, temperature=1.0, seq_len=512)
    rl = sample.channel_weights["rl"]
    assert sum(rl) == sum(model) and all(lp == (-0.5 if w else 0.0) for lp, w in zip(sample.sampling_logprobs, rl))
    assert all(a == (2.0 if w else 0.0) for a, w in zip(sample.advantages, rl))
    assert r.weight_version == 4  # the oldest policy among the three turns (6, 5, 4)


def test_malformed_calls_come_back_as_errors_and_the_turn_limit_ends_the_episode(tok, task):
    r, _ = run(tok, task, ['<tool_call>{"name": "calc", "arguments": {"expr": 874}</tool_call>',
                           '<tool_call>{"name": "calc", "arguments": {"expr": 874}}</tool_call>', RIGHT], max_turns=3)
    assert r.turns[0].error.startswith("the tool call is not valid JSON")
    assert r.turns[1].error == "'expr' must be a string, e.g. \"12 * 34\""
    assert len(r.turns) == 3 and r.reward == 0.0  # the limit came before an answer
    assert r.metrics["tool_errors"] == 2.0


def test_a_reply_without_a_call_is_the_answer_and_single_turn_tasks_never_parse(tok, task):
    r, _ = run(tok, task, ["1660"])
    assert len(r.turns) == 1 and r.turns[0].call is None and r.reward == 1.0 and r.metrics["tool_calls"] == 0.0
    reverse = load_tasks("reverse-text", {"num_tasks": 1})[0]
    r, _ = asyncio.run(rollout(ScriptedPolicy(tok, [RIGHT]), tok, "reverse-text", reverse, SamplingParams(), 512, 8, 0,
                               asyncio.Semaphore(1))), None
    assert len(r.turns) == 1 and r.turns[0].call is None and "tool_calls" not in r.metrics


def test_the_context_budget_stops_generation(tok, task):
    prompt = len(encode_chat(tok, [{"role": "system", "content": task.data.system_prompt},
                                   {"role": "user", "content": task.data.prompt}]))
    full, _ = run(tok, task, [WRONG, RIGHT, "1660"])
    second_turn_at = prompt + full.turns[1].start
    r, policy = run(tok, task, [WRONG, RIGHT, "1660"], seq_len=second_turn_at + 3)
    assert len(policy.prompts) == 2 and len(policy.prompts[1]) == second_turn_at
    assert r.finish_reason == "length" and len(r.prompt_ids + r.completion_ids) == second_turn_at + 3
    assert len(r.turns) == 2 and r.turns[1].call is None and r.reward == 0.0  # a cut reply makes no call


@pytest.mark.parametrize("text,error", [
    ("no call here", None),
    ('<tool_call>{"name": "calc"', "the tool call is not closed: end it with </tool_call>"),
    ("<tool_call>[1, 2]</tool_call>", 'the tool call needs a "name" string: {"name": ..., "arguments": {...}}'),
    ('<tool_call>{"name": "calc", "arguments": "1+2"}</tool_call>', '"arguments" of calc must be a JSON object'),
])
def test_tool_call_parser_errors(text, error):
    got = parse_tool_call(text)
    assert (got is None) if error is None else (got.error == error)


def test_error_turns_become_hinted_teachers_over_the_same_tokens(tok, task):
    r, _ = run(tok, task, [WRONG, RIGHT, "The answer is 1660"])
    assert r.sites == [ErrorSite(0, "unknown_tool", "unknown tool 'calculator'; the tools are: calc", "calculator"),
                       ErrorSite(2, "format", "the final reply must be the number only")]
    stats = DistillStats()
    teachers = asyncio.run(Distiller(DistillConfig(enabled=True), tok, client=None).attach(r, stats))
    assert (stats.sites, stats.hinted) == (2, 2) and len(teachers) == 2
    ids = r.prompt_ids + r.completion_ids
    hint = 'The only tool is `calc`, not `calculator`: <tool_call>{"name": "calc", "arguments": {"expr": "874 + 786"}}</tool_call>'
    first = teachers[0]  # the environment's hint, as a user message before the error turn
    assert first.input_ids[: first.start] == encode_chat(tok, r.opening + [{"role": "user", "content": hint}])
    for t, turn in zip(teachers, (r.turns[0], r.turns[2])):
        assert (t.student_start, t.length) == (len(r.prompt_ids) + turn.start, turn.end - turn.start)
        assert t.input_ids[t.start:] == ids[t.student_start: t.student_start + t.length]
    sample = distill_only(r, teachers, temperature=1.0, seq_len=512)
    on = [i for i, w in enumerate(sample.channel_weights["distill"]) if w]
    assert on == [i for t in teachers for i in range(t.student_start, t.student_start + t.length)]
    assert sum(sample.channel_weights["rl"]) == 0  # a distill-only sample
    # cut inside the last error turn: that teacher is dropped, the first stays
    assert len(with_teachers(r.to_sample(0.0, 1.0, teachers[1].student_start + 2), teachers).channel_data["distill"]) == 1


class RunsPastItsStop(ScriptedPolicy):
    """A server that drew on after its stop token (a buggy engine, or a volunteer's completion)."""

    async def generate(self, prompt_ids, params):
        c = await super().generate(prompt_ids, params)
        more = self.tok.encode("9999", add_special_tokens=False)
        return Completion(c.token_ids + more, c.logprobs + [-0.5] * len(more), "length", c.weight_version, c.node)


def test_nothing_after_a_stop_token_reaches_the_rollout_or_its_reward(tok, task):
    """"1660", the end of sequence, then "9999": decoded with special tokens skipped the turn would read
    "16609999" (reward 0); it is cut at the stop token, which it keeps (reward 1, finish "stop")."""
    policy = RunsPastItsStop(tok, ["1660"])
    r = asyncio.run(rollout(policy, tok, "tool-calc", task, SamplingParams(max_tokens=128), 512, 8, 5, asyncio.Semaphore(1)))
    answer = tok.encode("1660", add_special_tokens=False) + [tok.eos_token_id]
    assert r.completion_ids == answer and len(r.logprobs) == len(answer)
    assert r.reward == 1.0 and r.finish_reason == "stop"

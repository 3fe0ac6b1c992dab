"""Hinters without a server: templates rendered exactly, per-kind overrides, bad templates refused at construction, the environment's own hook, the chain's order and the configured build."""

import asyncio

import pytest

from composer_prime.env_runtime.error_sites import ErrorSite
from composer_prime.orchestrator.hints import (ChainHinter, EnvHinter, HintContext, TemplateHinter,
                                               make_hinter)
from tests.support.hint_cases import CALC, LOOKUP, UNKNOWN, context, hint


def test_templates_render_exactly():
    t = TemplateHinter()
    assert hint(t, UNKNOWN) == ('The tool is called `calc`, not `calculator`. '
                                'Call it as <tool_call>{"name": "calc", "arguments": {"expr": "..."}}</tool_call>.')
    # the example is of the tool that was called, with its required strings only
    bad = ErrorSite(0, "bad_arguments", "'limit' is a required property", "lookup")
    assert hint(t, bad, context([CALC, LOOKUP])) == (
        "The arguments of `lookup` are wrong: 'limit' is a required property. "
        'Call it as <tool_call>{"name": "lookup", "arguments": {"query": "..."}}</tool_call>.')
    parse = ErrorSite(0, "parse", "the tool call is not closed: end it with </tool_call>")
    assert hint(t, parse, context([])) == ("Your tool call could not be read: the tool call is not closed: end it "
                                           'with </tool_call>. Write it as <tool_call>{"name": "...", "arguments": '
                                           "{...}}</tool_call>.")
    assert hint(t, ErrorSite(2, "stalled", "no progress in 3 turns")) == (
        "This turn went wrong: no progress in 3 turns. Fix it and try again.")


def test_configured_templates_override_per_kind_and_add_kinds():
    t = TemplateHinter({"unknown_tool": "Use {tools}.", "stalled": "Stop repeating ({detail})."})
    assert hint(t, UNKNOWN) == "Use `calc`."
    assert hint(t, ErrorSite(1, "stalled", "same call twice")) == "Stop repeating (same call twice)."
    assert hint(t, ErrorSite(1, "tool_error", "boom", "calc")) == (
        "The tool answered with an error: boom. Fix the call and try again.")


@pytest.mark.parametrize("template,message", [
    ("Say {answer}.", "hint template for 'format' has unknown field {answer}; fields: detail, name, tools, example"),
    ("Say {}.", "hint template for 'format' has unknown field {}"),
    ("Say {detail.upper}.", "hint template for 'format' has unknown field {detail.upper}"),
    ("Say {detail", "hint template for 'format' is malformed"),
])
def test_a_bad_template_fails_at_construction(template, message):
    with pytest.raises(ValueError) as e:
        TemplateHinter({"format": template})
    assert str(e.value).startswith(message)


class SyncTask:
    def hint(self, site: ErrorSite, ctx: HintContext) -> str | None:
        return f"sync {site.name} after {ctx.messages[-1]['content']}" if site.kind == "unknown_tool" else None


class AsyncTask:
    async def hint(self, site: ErrorSite, ctx: HintContext) -> str | None:
        await asyncio.sleep(0)
        return f"async {site.kind}"


def test_env_hinter_calls_the_tasks_hook_sync_or_async():
    env = EnvHinter()
    assert hint(env, UNKNOWN, context(task=SyncTask())) == "sync calculator after 874 + 786"
    assert hint(env, ErrorSite(0, "parse", "x"), context(task=SyncTask())) is None
    assert hint(env, UNKNOWN, context(task=AsyncTask())) == "async unknown_tool"
    assert hint(env, UNKNOWN, context(task=object())) is None
    assert hint(env, UNKNOWN, context(task=None)) is None


class Fixed:
    def __init__(self, answer: str | None) -> None:
        self.answer, self.asked = answer, 0

    async def __call__(self, site: ErrorSite, ctx: HintContext) -> str | None:
        self.asked += 1
        return self.answer


def test_chain_takes_the_first_non_empty_hint_in_order():
    none, blank, a, b = Fixed(None), Fixed("  \n"), Fixed("  A  "), Fixed("B")
    assert hint(ChainHinter([none, blank, a, b]), UNKNOWN) == "A"
    assert (none.asked, blank.asked, a.asked, b.asked) == (1, 1, 1, 0)
    assert hint(ChainHinter([b, a]), UNKNOWN) == "B"
    assert hint(ChainHinter([none, blank]), UNKNOWN) is None


def test_make_hinter_builds_the_configured_order():
    chain = make_hinter(["env", "template"], {"unknown_tool": "T {name}"}, None, None, 1.0, None)
    assert [type(h) for h in chain.hinters] == [EnvHinter, TemplateHinter]
    assert hint(chain, UNKNOWN, context(task=SyncTask())) == "sync calculator after 874 + 786"
    assert hint(chain, UNKNOWN, context(task=object())) == "T calculator"
    assert [type(h) for h in make_hinter(["template", "env"], {}, None, None, 1.0, None).hinters] == [
        TemplateHinter, EnvHinter]
    with pytest.raises(ValueError, match=r"^hint source 'llm' needs both llm_url and llm_model$"):
        make_hinter(["template", "llm"], {}, "http://127.0.0.1:1", None, 1.0, None)
    with pytest.raises(ValueError, match=r"^unknown hint source 'human'"):
        make_hinter(["human"], {}, None, None, 1.0, None)
    with pytest.raises(ValueError, match="unknown field {answer}"):
        make_hinter(["template"], {"format": "{answer}"}, None, None, 1.0, None)

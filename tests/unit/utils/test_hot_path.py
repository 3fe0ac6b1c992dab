"""What the orchestrator's per-rollout path keeps instead of redoing (benchmarks/orchestrator_ceiling.py):
a prompt rendered once per task by the chat template, and the start-up heap left out of garbage collection."""

import gc

import pytest
from transformers import AutoTokenizer

from composer_prime.utils import chat
from composer_prime.utils.chat import encode_chat, prompt_ids
from composer_prime.utils.proc import long_lived

OPENING = [{"role": "system", "content": "Reverse the letters."}, {"role": "user", "content": "a b c d"}]


@pytest.fixture
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)  # a fresh one per test: the cache is per tokenizer


def test_a_remembered_prompt_is_the_rendered_one(tok):
    first = prompt_ids(tok, OPENING)
    assert first == encode_chat(tok, OPENING) and len(chat._prompts[tok]) == 1
    first.append(-1)  # the caller's own list: changing it changes no later prompt
    assert prompt_ids(tok, OPENING) == encode_chat(tok, OPENING) and len(chat._prompts[tok]) == 1
    other = [OPENING[0], {"role": "user", "content": "b a"}]
    assert prompt_ids(tok, other) == encode_chat(tok, other) and len(chat._prompts[tok]) == 2
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    assert prompt_ids(tok, OPENING, tools=tools) == encode_chat(tok, OPENING, tools=tools)


def test_a_new_template_or_a_clock_renders_again(tok):
    prompt_ids(tok, OPENING)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    assert tok.decode(prompt_ids(tok, OPENING)) == "Reverse the letters.|a b c d|"
    tok.chat_template = "{{ strftime_now('%Y') }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    cached = len(chat._prompts[tok])
    assert prompt_ids(tok, OPENING) == encode_chat(tok, OPENING) and len(chat._prompts[tok]) == cached  # never kept


def test_the_cache_is_bounded(tok, monkeypatch):
    monkeypatch.setattr(chat, "PROMPTS_KEPT", 3)
    for i in range(5):
        prompt_ids(tok, [{"role": "user", "content": f"a {i}"}])
    assert len(chat._prompts[tok]) == 3


def test_long_lived_freezes_the_heap_and_gives_it_back():
    before = gc.get_freeze_count()  # 0 on 3.11; CPython 3.12.1 starts with a few hundred frozen (375 seen)
    with long_lived():
        assert gc.get_freeze_count() > before + 1000  # this process's modules, at least
    assert gc.get_freeze_count() <= before  # gc.unfreeze gives back all, the interpreter's own included

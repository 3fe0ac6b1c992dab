"""Hint sources: templates render exactly and fail at construction, the environment's hook (sync
and async), the chain's order, and the LLM hinter against a local stand-in chat server (cache,
cache file, timeout, unusable replies)."""

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from composer_prime.env_runtime.error_sites import ErrorSite
from composer_prime.orchestrator.hints import (ChainHinter, EnvHinter, HintContext, LLMHinter, TemplateHinter,
                                               make_hinter)

CALC = {"type": "function", "function": {
    "name": "calc", "description": "integer arithmetic",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}
LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "search",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["query", "limit"]}}}
TURN = '<tool_call>{"name": "calculator", "arguments": {"expr": "874 + 786"}}</tool_call>'
UNKNOWN = ErrorSite(0, "unknown_tool", "unknown tool 'calculator'; the tools are: calc", "calculator")


def context(tools: list[dict] | None = None, task=None) -> HintContext:
    return HintContext([{"role": "user", "content": "874 + 786"}], TURN, [CALC] if tools is None else tools, task)


def hint(hinter, site: ErrorSite, ctx: HintContext | None = None) -> str | None:
    return asyncio.run(hinter(site, ctx or context()))


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


# --- the LLM hinter against a local stand-in for an OpenAI-compatible server -------------------------

REPLY = "  Use the tool `calc`, not `calculator`.  "


class StandInHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        server: StandInChatServer = self.server
        server.requests.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
        if server.mode == "slow":
            time.sleep(1.0)
        status, body = {
            "slow": (200, {"choices": [{"message": {"content": REPLY}}]}),
            "ok": (200, {"choices": [{"message": {"role": "assistant", "content": REPLY}}]}),
            "no_choices": (200, {"object": "error", "message": "model not loaded"}),
            "null_content": (200, {"choices": [{"message": {"content": None}}]}),
            "500": (500, {"error": "overloaded"}),
        }.get(server.mode, (200, None))
        payload = b'{"choices": [' if body is None else json.dumps(body).encode()  # "garbage": cut JSON
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            pass  # the client gave up waiting (the timeout test)

    def log_message(self, *args) -> None:
        pass


class StandInChatServer(ThreadingHTTPServer):
    """A local stand-in for an OpenAI-compatible /v1/chat/completions server."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), StandInHandler)
        self.requests: list[tuple[str, dict]] = []
        self.mode = "ok"
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def server():
    srv = StandInChatServer()
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)  # quick shutdown
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def ask(hinter: LLMHinter, ctx: HintContext, times: int = 2) -> list[str | None]:
    async def go():
        try:
            return [await hinter(UNKNOWN, ctx) for _ in range(times)]
        finally:
            await hinter.close()
    return asyncio.run(go())


def test_llm_hint_is_asked_once_then_cached_and_the_cache_file_reloads(server, tmp_path):
    cache = tmp_path / "hints" / "cache.jsonl"
    h = LLMHinter(server.url + "/", "hint-model", cache_path=cache, max_tokens=48)
    assert ask(h, context()) == [REPLY.strip(), REPLY.strip()]
    assert (h.calls, h.hits, h.failures) == (1, 1, 0) and len(server.requests) == 1
    path, body = server.requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "hint-model" and body["max_tokens"] == 48
    system, user = body["messages"]
    assert system["role"] == "system" and "Do not give the final answer" in system["content"]
    assert "Error (unknown_tool): unknown tool 'calculator'; the tools are: calc" in user["content"]
    assert TURN in user["content"] and '"name": "calc"' in user["content"]
    assert len(cache.read_text().splitlines()) == 1

    with cache.open("a") as f:
        f.write('{"key": "torn\n')  # an interrupted write: skipped on load
    again = LLMHinter(server.url, "hint-model", cache_path=cache)
    assert ask(again, context()) == [REPLY.strip(), REPLY.strip()]
    assert (again.calls, again.hits) == (0, 2) and len(server.requests) == 1
    # the key covers the model and the turn: either changing is a new question
    other = LLMHinter(server.url, "other-model", cache_path=cache)
    ask(other, context())
    changed = LLMHinter(server.url, "hint-model", cache_path=cache)
    ask(changed, HintContext([], TURN.replace("874", "875"), [CALC]))
    assert (other.calls, changed.calls) == (1, 1) and len(server.requests) == 3


def test_llm_hinter_gives_up_at_its_timeout(server):
    server.mode = "slow"
    h = LLMHinter(server.url, "hint-model", timeout_s=0.3)
    t0 = time.monotonic()
    assert ask(h, context(), times=1) == [None]
    assert time.monotonic() - t0 < 0.9  # it gave up well before the server's 1 s answer
    assert (h.calls, h.failures, h.hits, h.cache) == (1, 1, 0, {}) and len(server.requests) == 1


@pytest.mark.parametrize("mode", ["garbage", "no_choices", "null_content", "500", "down"])
def test_llm_hinter_fails_soft_on_unusable_replies(server, mode):
    server.mode = mode
    url = server.url
    if mode == "down":
        server.shutdown()
        server.server_close()
    h = LLMHinter(url, "hint-model", timeout_s=5.0)
    assert ask(h, context()) == [None, None]
    assert (h.calls, h.failures, h.cache) == (2, 2, {})


def test_bad_hint_config_is_a_one_line_config_error(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    for flag, value, message in (("--orchestrator.distill.hints.templates", '{parse = "see {nope}"}', "unknown field {nope}"),
                                 ("--orchestrator.distill.hints.sources", '["llm"]', "needs llm_url and llm_model")):
        r = subprocess.run([sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/tool-calc-distill.toml",
                            flag, value, "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]

"""The LLM hinter against a local stand-in chat server (cache, cache file, timeout, unusable
replies), and a bad hint config as one line from `rl`."""

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from composer_prime.orchestrator.hints import (HintContext, LLMHinter)
from tests.support import forkserver
from tests.support.hint_cases import CALC, TURN, UNKNOWN, context




















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
    # the slow server does answer, with a valid hint, 1 s later: None means the hinter gave up first (no clock read)
    assert ask(h, context(), times=1) == [None]
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
    import sys

    from tests.conftest import ROOT

    for flag, value, message in (("--orchestrator.distill.hints.templates", '{parse = "see {nope}"}', "unknown field {nope}"),
                                 ("--orchestrator.distill.hints.sources", '["llm"]', "needs llm_url and llm_model")):
        r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.rl", "@", "configs/tool-calc-distill.toml",
                            flag, value, "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]

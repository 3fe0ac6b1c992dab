"""A STAND-IN for a hosted teacher API, for tests: a local HTTP server speaking OpenAI's
`POST /v1/chat/completions` (a hosted API cannot be reached from here). It answers every state
with its own scripted action and real-looking `usage`, and can misbehave like a real endpoint:
answer slowly (past a client's timeout), answer garbage (not JSON), or fail its first requests.
It counts every request it received, so a test can prove a call was or was not made.

    python -m tests.support.teacher_standin --port 8301 --reply '{"content": "FIX"}' [--delay 0.2] [--mode ok|slow|garbage|flaky]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time

from aiohttp import web


class TeacherStandin:
    def __init__(self, reply: dict, delay_s: float = 0.0, mode: str = "ok", fail_first: int = 0) -> None:
        self.reply, self.delay_s, self.mode, self.fail_first = reply, delay_s, mode, fail_first
        self.requests = 0

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.mode == "slow":
            await asyncio.sleep(30)
        if self.mode == "garbage":
            return web.Response(text="<html>502 Bad Gateway</html>", content_type="text/html")
        if self.mode == "flaky" and self.requests <= self.fail_first:
            return web.Response(status=503, text="overloaded")
        prompt_tokens = len(json.dumps(body["messages"])) // 4
        message = {"role": "assistant", "content": self.reply.get("content")}
        if self.reply.get("tool_calls"):
            message["tool_calls"] = self.reply["tool_calls"]
        return web.json_response({
            "id": f"chatcmpl-{self.requests}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model"), "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 20, "total_tokens": prompt_tokens + 20}})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app


def serve_in_thread(standin: TeacherStandin, port: int) -> threading.Thread:
    """Serve on 127.0.0.1:port from a daemon thread (returns once it listens)."""
    ready = threading.Event()

    def main() -> None:
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(standin.app(), access_log=None)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    ready.wait(10)
    return thread


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--reply", default='{"content": "FIX"}')
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--mode", default="ok")
    a = p.parse_args()
    web.run_app(TeacherStandin(json.loads(a.reply), a.delay, a.mode).app(), host="127.0.0.1", port=a.port,
                print=None, access_log=None)

"""The orchestrator's inference client when connections drop: a dropped request is sent again, an
idle connection is not reused past the keep-alive, and a server that never answers stops the
orchestrator with one line (exit 2) instead of a traceback.

The server here is a local HTTP/1.1 keep-alive server written for the test (asyncio streams, the
same JSON as /inference/v1/generate and /health) that can close a connection instead of
answering: the real servers (uvicorn) do that to idle connections, but not on cue.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from composer_prime.config.sampling import SamplingParams
from composer_prime.orchestrator.client import KEEPALIVE_S, RETRY_DELAYS_S, InferenceClient, InferenceUnreachable
from composer_prime.orchestrator.pool import HttpNode
from composer_prime.transports.batches.zmq import BatchReceiver
from composer_prime.utils.net import free_port
from tests.conftest import ROOT
from tests.support import forkserver

CHOICE = {"token_ids": [5, 6], "logprobs": {"content": [{"token_id": 5, "logprob": -0.5}, {"token_id": 6, "logprob": -0.25}]},
          "finish_reason": "length", "weight_version": 3}


class DroppingServer:
    """Answers GET /health (weight_version 0) and POST /inference/v1/generate (n choices of CHOICE);
    closes the connection without an answer where `drop(request number, path)` says so."""

    def __init__(self, drop: Callable[[int, str], bool]) -> None:
        self.drop, self.requests, self.connections = drop, 0, 0
        self.port = free_port()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            length = re.search(rb"content-length: *(\d+)", head, re.I)
            body = json.loads(await reader.readexactly(int(length.group(1)))) if length else {}
            path = head.split(b" ")[1].decode()
            self.requests += 1
            if self.drop(self.requests, path):
                writer.close()
                return
            answer = {"weight_version": 0} if path == "/health" else \
                {"weight_version": 3, "choices": [{"index": i, **CHOICE} for i in range(body.get("n", 1))]}
            data = json.dumps(answer).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
            await writer.drain()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def generate_with(server: DroppingServer, pauses: tuple[float, ...] = (0.0,)):
    """One generate per pause (slept before it), against `server` run in the same loop."""

    async def go():
        srv = await asyncio.start_server(server.serve, "127.0.0.1", server.port)
        client = InferenceClient([server.url()], "tiny")
        try:
            out = []
            for pause in pauses:
                await asyncio.sleep(pause)
                out.append(await client.generate([1, 2, 3], SamplingParams(max_tokens=2, seed=0)))
            return out, client.requests
        finally:
            await client.close()
            srv.close()

    return asyncio.run(go())


def test_a_dropped_request_is_sent_again():
    server = DroppingServer(lambda n, path: n == 1)
    [c], logical = generate_with(server)
    assert (c.token_ids, c.logprobs, c.weight_version, c.node) == ([5, 6], [-0.5, -0.25], 3, server.url())  # who answered
    assert (logical, server.requests, server.connections) == (1, 2, 2)  # one request, sent twice, on a new connection


def test_a_joined_node_that_cannot_be_reached_leaves_the_pool_and_nothing_is_lost():
    trusted, volunteer = DroppingServer(lambda n, path: False), DroppingServer(lambda n, path: True)

    async def go():
        servers = [await asyncio.start_server(s.serve, "127.0.0.1", s.port) for s in (trusted, volunteer)]
        client = InferenceClient([trusted.url()], "tiny")
        client.pool.join(HttpNode(volunteer.url(), "tiny", client._post, trusted=False))  # one that joined
        try:
            return [await client.generate([1, 2, k], SamplingParams(max_tokens=2, seed=0)) for k in range(4)], client.pool
        finally:
            await client.close()
            for srv in servers:
                srv.close()

    out, pool = asyncio.run(go())
    assert [c.node for c in out] == [trusted.url()] * 4  # every request answered, by the trusted server
    assert list(pool.nodes) == [trusted.url()] and "unreachable" in pool.left[volunteer.url()]
    assert volunteer.requests == len(RETRY_DELAYS_S) + 1  # tried (with its retries) once, then gone


def test_a_server_that_drops_every_time_is_one_clear_error():
    server = DroppingServer(lambda n, path: True)
    with pytest.raises(InferenceUnreachable, match=rf"inference at {server.url()} is unreachable: "
                                                    r"/inference/v1/generate failed 3 times \(ServerDisconnectedError"):
        generate_with(server)
    assert server.requests == len(RETRY_DELAYS_S) + 1


def test_nothing_listening_is_one_clear_error():
    server = DroppingServer(lambda n, path: False)  # never started
    client = InferenceClient([server.url()], "tiny")

    async def go():
        try:
            await client.generate([1, 2, 3], SamplingParams(max_tokens=2))
        finally:
            await client.close()

    t = time.time()
    with pytest.raises(InferenceUnreachable, match=r"failed 3 times \(ClientConnectorError"):
        asyncio.run(go())
    assert time.time() - t >= sum(RETRY_DELAYS_S)  # it waited between attempts



def test_a_server_that_never_answers_is_one_clear_error_after_the_timeout():
    """A host cut off the network (tests/integration/test_separate_machines.py cuts one): nothing
    comes back, and after `inference_timeout_s` the error names the server, not a bare TimeoutError."""
    port = free_port()

    async def go():
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # reads the request and never answers

        srv = await asyncio.start_server(silent, "127.0.0.1", port)
        client = InferenceClient([f"http://127.0.0.1:{port}"], "tiny", timeout_s=0.5)
        errors = []
        try:
            for call in (client.versions(), client.generate([1, 2, 3], SamplingParams(max_tokens=2))):
                with pytest.raises(InferenceUnreachable) as e:
                    await call
                errors.append(str(e.value))
        finally:
            await client.close()
            srv.close()
        return errors

    assert asyncio.run(go()) == [
        f"inference at http://127.0.0.1:{port} did not answer {route} in 0.5 s (orchestrator.inference_timeout_s)"
        for route in ("/health", "/inference/v1/generate")]


def test_an_idle_connection_is_not_reused_past_the_keepalive():
    """Back to back: one connection. Idle longer than KEEPALIVE_S (under uvicorn's 5 s): a new one,
    so a request never meets a connection the server is closing."""
    server = DroppingServer(lambda n, path: False)
    _, logical = generate_with(server, (0.0, 0.0, KEEPALIVE_S + 0.5))
    assert KEEPALIVE_S < 5 and (logical, server.requests, server.connections) == (3, 3, 2)


def test_the_orchestrator_stops_in_one_line_when_inference_is_gone(tmp_path, tiny_model_dir):
    """The real orchestrator, a trainer's end of the batch transport announcing step 0, and an
    inference server that answers /health but drops every generate."""
    server = DroppingServer(lambda n, path: path != "/health")
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    async def serve():
        await asyncio.start_server(server.serve, "127.0.0.1", server.port)
        ready.set()

    threading.Thread(target=lambda: (loop.run_until_complete(serve()), loop.run_forever()), daemon=True).start()
    ready.wait(10)
    address = f"tcp://127.0.0.1:{free_port()}"
    receiver = BatchReceiver(address)
    proc = forkserver.Popen([sys.executable, "-m", "composer_prime.entrypoints.orchestrator", "--output_dir", str(tmp_path),
                             "--inference_urls", f'["{server.url()}"]', "--transport.address", address],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while proc.poll() is None:  # the trainer says which step it expects until the orchestrator is done
            receiver.announce(0)
            time.sleep(0.2)
        err = proc.stderr.read().strip()
    finally:
        proc.kill()
        receiver.close()
        loop.call_soon_threadsafe(loop.stop)
    assert proc.returncode == 2 and err.count("\n") == 0 and "Traceback" not in err, (proc.returncode, err[-3000:])
    assert err.startswith(f"error: inference at {server.url()} is unreachable: /inference/v1/generate failed 3 times")
    assert server.requests - 1 >= len(RETRY_DELAYS_S) + 1  # /health, then one generate and its retries at least

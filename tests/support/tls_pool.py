"""The two ends of test_volunteers_tls.py's network namespaces, each a process run inside one:

- `python -m tests.support.tls_pool serve RUN_DIR HOST PORT`: the volunteer pool built as a run builds
  it (`VolunteerPool.build`, `volunteers.tls` unset, invites only), listening on HOST; prints one line,
  `<the scheme it says it serves> <an invite's token pinned to the run's certificate>`, then serves
  until killed.
- `python -m tests.support.tls_pool probe HOST PORT PIN`: what another host sees there (the standard
  library only, so it starts at once): over TLS, whether the certificate is the one PIN names and the
  status line a join gets; in clear, what the same join gets. Prints one JSON line."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import ssl
import sys
from pathlib import Path

JOIN = (b"POST /pool/join HTTP/1.1\r\nHost: pool\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
        b"Connection: close\r\n\r\n{}")


async def serve(run_dir: Path, host: str, port: int) -> None:
    from composer_prime.config.models import OrchestratorConfig
    from composer_prime.orchestrator.pool import NodePool
    from composer_prime.volunteer.pool import VolunteerPool
    from composer_prime.volunteer.tls import pinned_token

    cfg = OrchestratorConfig(model="tiny", inference_urls=["http://127.0.0.1:1"], output_dir=run_dir,
                             volunteers={"enabled": True, "host": host, "port": port})
    pool = VolunteerPool.build(cfg, NodePool([]), None, lambda: 0)
    await pool.start()
    print("https" if pool.tls else "http", pinned_token(pool.invites.invite("alice"), run_dir), flush=True)
    await asyncio.Event().wait()


def answer(sock) -> str:
    """The reply's status line, or what came instead of one."""
    sock.sendall(JOIN)
    reply = b""
    while chunk := sock.recv(4096):
        reply += chunk
    return reply.partition(b"\r\n")[0].decode() if reply.startswith(b"HTTP/") else f"no HTTP answer ({len(reply)} bytes)"


def probe(host: str, port: int, pin: str) -> dict:
    seen = {}
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # checked by its pin, below
    try:
        with socket.create_connection((host, port), timeout=10) as raw, context.wrap_socket(raw) as tls:
            mine = hashlib.sha256(tls.getpeercert(binary_form=True)).hexdigest() == pin
            seen["certificate"] = "the pinned one" if mine else "another"
            seen["over_tls"] = answer(tls)
    except (ssl.SSLError, OSError) as e:
        seen["certificate"] = f"no TLS: {type(e).__name__}"
    try:
        with socket.create_connection((host, port), timeout=10) as raw:
            seen["in_clear"] = answer(raw)
    except OSError as e:
        seen["in_clear"] = f"no HTTP answer ({type(e).__name__})"
    return seen


if __name__ == "__main__":
    what, *args = sys.argv[1:]
    if what == "serve":
        asyncio.run(serve(Path(args[0]), args[1], int(args[2])))
    else:
        print(json.dumps(probe(args[0], int(args[1]), args[2])), flush=True)

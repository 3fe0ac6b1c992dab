"""Nothing replayable, nothing in clear (issue 36, part 4): the pool over TLS on loopback, its
self-signed certificate pinned by the token (volunteer/tls.py), and the worker's own join code.

A worker whose token pins the run's certificate joins over https and hears where the weights are;
one whose token pins another certificate (someone else answering at that address: a man in the
middle, a stale token) stops with one line instead of trusting the answer; a client that checks no
certificate still sees only TLS (nothing readable in clear). A hello copied off the wire and sent
again is refused, and so is a second use of a join. Beyond loopback the pool serves TLS with
`volunteers.tls` unset (its default), seen from another host: two network namespaces the test makes
(benchmarks/support/netem.py), the pool listening on 0.0.0.0 in one, a worker joining from the other
(issue 42 part 3 item 4). A worker given an https pool and a token that pins nothing stops at once."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys

import aiohttp
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from composer_prime.config.volunteers import VolunteersConfig, WorkerConfig
from composer_prime.contract.volunteer import hello
from composer_prime.orchestrator.pool import NodePool
from composer_prime.contract.weights import Directory
from composer_prime.volunteer.pool import VolunteerPool
from composer_prime.utils.net import free_port
from composer_prime.volunteer.invites import Invites, store_path
from composer_prime.volunteer.tls import cert_dir, ensure_cert, pinned_token, split_token
from composer_prime.volunteer.worker import Ejected, Worker
from benchmarks.support import netem
from tests.conftest import ROOT
from tests.support import forkserver
from tests.support.bad_input import run_bad_input

WEIGHTS = Directory("/run/weights")


async def pool_over_tls(run_dir):
    port = free_port()
    cfg = VolunteersConfig(enabled=True, port=port, tls=True)
    pool = VolunteerPool(cfg, NodePool([]), None, WEIGHTS, "tiny", Invites(store_path(run_dir)),
                         ensure_cert(cert_dir(run_dir)))
    await pool.start()
    return pool, f"https://127.0.0.1:{port}"


async def joined(url: str, token: str, tmp_path) -> dict:
    """The worker's own join over its own connector (pinned by the token)."""
    w = Worker(WorkerConfig(join=url, token=token, key_path=tmp_path / "w.key", work_dir=tmp_path / "w"),
               Ed25519PrivateKey.generate())
    w._http = aiohttp.ClientSession(connector=w._connector())
    try:
        return await w.join(wait_s=5)
    finally:
        await w._http.close()


def test_a_token_pinning_the_runs_certificate_joins_over_tls_and_another_pin_is_refused(tmp_path):
    run_dir = tmp_path / "run"

    async def go():
        pool, url = await pool_over_tls(run_dir)
        try:
            secret = pool.invites.invite("alice")
            good = await joined(url, pinned_token(secret, run_dir), tmp_path)
            other = pinned_token(secret, tmp_path / "another-run")  # the same secret, another certificate
            with pytest.raises(Ejected, match="is not the run's: its certificate does not match"):
                await joined(url, other, tmp_path)
            async with aiohttp.ClientSession() as http:  # an eavesdropper's plain HTTP: no answer in clear
                with pytest.raises(aiohttp.ClientError):
                    await http.post(f"http://127.0.0.1:{url.rsplit(':', 1)[1]}/pool/join", json={})
            return good, sorted(pool.members)
        finally:
            await pool.stop()
    info, members = asyncio.run(go())
    assert info.weights == WEIGHTS and len(members) == 1  # the pinned worker joined; the other never spoke
    assert split_token(pinned_token("s", run_dir))[1] == split_token(pinned_token("t", run_dir))[1]  # one cert a run


def test_a_replayed_hello_or_join_is_refused(tmp_path):
    run_dir = tmp_path / "run"

    async def go():
        pool, url = await pool_over_tls(run_dir)
        key, token = Ed25519PrivateKey.generate(), split_token(pool.invites.invite("bob"))[0]
        context = ssl.create_default_context(cafile=str(cert_dir(run_dir) / "pool.crt"))
        context.check_hostname = False  # a self-signed certificate for no host name: pinned, not named
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as http:
                async def post(route, body):
                    async with http.post(f"{url}/pool/{route}", json=body) as r:
                        return r.status, await r.text()
                join = hello(key, "join", token=token)
                beat = hello(key, "heartbeat")
                return [await post("join", join), await post("join", join), await post("heartbeat", beat),
                        await post("heartbeat", beat), await post("heartbeat", hello(key, "heartbeat"))], pool.refused
        finally:
            await pool.stop()
    answers, refused = asyncio.run(go())
    assert [s for s, _ in answers] == [200, 403, 200, 403, 200]
    assert "used already" in answers[1][1] and "used already" in answers[3][1] and refused["replayed"] == 2


def test_a_worker_told_to_join_in_clear_beyond_loopback_is_one_line_exit_2(tmp_path):
    run_bad_input("composer_prime.entrypoints.worker", ["--join", "http://10.0.0.7:8600", "--token", "t", "--dry-run"],
                  "join: http://10.0.0.7:8600 is beyond loopback, where the pool serves https only (nothing in clear): "
                  "https://10.0.0.7:8600")


def test_a_worker_given_an_https_pool_and_a_token_pinning_nothing_stops_before_any_request(tmp_path):
    """Refused at the start (an Ejected: the worker's command says it in one line, exit 2, as for a wrong
    token in test_volunteers.py); nothing listens at that port, so a worker that went on would wait there."""
    cfg = WorkerConfig(join=f"https://127.0.0.1:{free_port()}", token="a-secret-alone", key_path=tmp_path / "w.key",
                       work_dir=tmp_path / "w")
    with pytest.raises(Ejected, match=r"^https://127\.0\.0\.1:\d+ is https but the token pins no certificate: use the "
                                      r"token the run's operator gave \(SECRET\.PIN\)$"):
        asyncio.run(Worker(cfg, Ed25519PrivateKey.generate()).run())


@pytest.mark.skipif(netem.available() is not None, reason=f"network namespaces: {netem.available()}")
def test_a_pool_beyond_loopback_serves_tls_by_default_to_another_host(tmp_path):
    run_dir, port = tmp_path / "run", 8600  # the namespaces are new: nothing else listens there
    with netem.linked() as (prefix, addr, _):
        pool = forkserver.Popen([*prefix[0], sys.executable, "-m", "tests.support.tls_pool", "serve", str(run_dir), "0.0.0.0",
                                 str(port)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            said = pool.stdout.readline().split()
            assert len(said) == 2, pool.stderr.read()[-3000:] if pool.wait(30) is not None else said
            probe = forkserver.run([*prefix[1], sys.executable, "-m", "tests.support.tls_pool", "probe", addr[0], str(port),
                                    split_token(said[1])[1]], cwd=ROOT, capture_output=True, text=True, timeout=60)
        finally:
            pool.kill()
            pool.wait()
    assert probe.returncode == 0, probe.stderr[-2000:]
    seen = json.loads(probe.stdout)
    assert (said[0], seen) == ("https", {"certificate": "the pinned one", "over_tls": "HTTP/1.1 403 Forbidden",
                                         "in_clear": "no HTTP answer (0 bytes)"}), seen

"""Beyond loopback nothing is unauthenticated: CURVE on the batch channel, a token on control routes.

Servers here bind 0.0.0.0 (the case that needs protection); every request goes to 127.0.0.1."""

import contextlib
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
import zmq
from safetensors.torch import load_file

from composer_prime.config import InferenceConfig, RLConfig
from composer_prime.config.plan import plan
from composer_prime.contract.batches import Batch, Sample, encode
from composer_prime.transports.auth import TOKEN_FILE, curve_keys, make_keys
from composer_prime.transports.batches.zmq import BatchReceiver, BatchSender
from composer_prime.transports.weights import filesystem
from tests.conftest import ROOT, free_port, start_until_ready
from tests.support import forkserver


def batch(step: int) -> Batch:
    s = Sample(input_ids=[1, 2, 3], sampling_logprobs=[0.0, -0.5, -1.0], advantages=[0.0, 1.0, 1.0],
               channel_weights={"rl": [0.0, 1.0, 1.0]})
    return Batch(step=step, samples=[s])


def forged_sender(port: int, server_key: bytes | None) -> zmq.Socket:
    """A sender without the orchestrator's key: plain (no CURVE), or CURVE with a key pair of its own
    (it knows the trainer's public key: public keys are not secret). One connection attempt only."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.RECONNECT_IVL, -1)
    sock.setsockopt(zmq.LINGER, 0)
    if server_key is not None:
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        sock.curve_serverkey = server_key
    sock.setsockopt(zmq.SNDTIMEO, 5000)
    sock.connect(f"tcp://127.0.0.1:{port}")
    # a DEALER's send waits for a peer: when the refused handshake ends before the send is queued (a loaded
    # machine), no peer is left and it would wait forever (seen once: the whole suite stalled behind it)
    with contextlib.suppress(zmq.Again):
        sock.send(encode(batch(0)))
    return sock


def test_a_forged_batch_is_refused_and_counted(tmp_path):
    keys = make_keys(tmp_path / "keys")
    port = free_port()
    receiver = BatchReceiver(f"tcp://0.0.0.0:{port}", curve_keys(keys, "trainer", "orchestrator"))
    trainer_public = curve_keys(keys, "trainer", "orchestrator")[0]
    forged = [forged_sender(port, None), forged_sender(port, trainer_public)]
    deadline = time.time() + 20
    got = []
    while receiver.stats["refused"] < 2 and time.time() < deadline:
        if (b := receiver.recv(timeout_s=0.2)) is not None:
            got.append(b)
    assert receiver.stats["refused"] == 2 and got == []  # one refused handshake per forger, nothing delivered

    sender = BatchSender(f"tcp://127.0.0.1:{port}", curve_keys(keys, "orchestrator", "trainer"))
    sender.send(batch(7))
    assert receiver.recv(timeout_s=20) == batch(7)
    receiver.announce(7)  # the way back works for the orchestrator, and for it alone
    deadline = time.time() + 20
    heard = []
    while not heard and time.time() < deadline:
        heard = sender.announcements()
        time.sleep(0.05)
    assert heard == [(receiver.id, 7)]
    assert [s.poll(200) for s in forged] == [0, 0]
    assert receiver.stats == {"received": 1, "refused": 2}
    for s in [*forged, sender]:
        s.close()
    receiver.close()


def test_keys_are_made_once_and_never_replaced(tmp_path):
    first = {p.name: p.read_bytes() for p in make_keys(tmp_path / "k").iterdir()}
    assert sorted(first) == ["inference.token", "orchestrator.key", "orchestrator.key_secret", "trainer.ed25519",
                             "trainer.ed25519.pub", "trainer.key", "trainer.key_secret"]
    assert {p.name: p.read_bytes() for p in make_keys(tmp_path / "k").iterdir()} == first
    assert {p.name for p in (tmp_path / "k").iterdir() if p.stat().st_mode & 0o077} == {
        "orchestrator.key", "trainer.key", "trainer.ed25519.pub"}  # only public halves are readable by others


def test_rl_plans_keys_for_all_three_once_one_listens_beyond_loopback(tmp_path):
    cfg = RLConfig.model_validate({"output_dir": str(tmp_path / "run"), "inference": {"host": "0.0.0.0"}})
    assert {p.name: p.config.auth.keys_dir for p in plan(cfg)} == dict.fromkeys(
        ["inference", "trainer", "orchestrator"], tmp_path / "run" / "keys")
    assert not (tmp_path / "run").exists()  # planning names the keys; rl makes them when it launches
    loopback = plan(RLConfig.model_validate({"output_dir": str(tmp_path / "run")}))
    assert [p.config.auth.keys_dir for p in loopback] == [None, None, None]


def test_vllm_server_address_is_not_configurable():
    with pytest.raises(ValueError, match="--host and --port are set by composer-prime"):
        InferenceConfig.model_validate({"vllm_args": ["--host=0.0.0.0"]})


@pytest.mark.parametrize("entrypoint, args", [
    ("inference", ["--host", "0.0.0.0"]),
    ("trainer", ["--transport.address", "tcp://0.0.0.0:5557"]),
    ("orchestrator", ["--transport.address", "tcp://192.0.2.7:5557"]),
    ("trainer", ["--transport.address", "tcp://*:5557"]),
    ("inference", ["--host", "127.0.0.1", "--auth.keys_dir", "{missing}"]),
])
def test_listening_beyond_loopback_without_keys_is_refused_in_one_line(tmp_path, entrypoint, args):
    args = [a.format(missing=tmp_path / "missing") for a in args]
    r = forkserver.run([sys.executable, "-m", f"composer_prime.entrypoints.{entrypoint}", "--output_dir", str(tmp_path),
                        *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "composer-prime keys make --out DIR" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_update_weights_without_the_token_is_refused_beyond_loopback(tmp_path, tiny_model_dir):
    keys = make_keys(tmp_path / "keys")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_until_ready([sys.executable, "-m", "composer_prime.entrypoints.inference", "--model", str(tiny_model_dir),
                              "--engine", "hf", "--host", "0.0.0.0", "--port", str(port), "--output_dir", str(tmp_path),
                              "--auth.keys_dir", str(keys)], lambda: httpx.get(f"{url}/health").status_code == 200)
    try:
        state = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
        step = filesystem.write_step(tmp_path / "weights", 1, {k: v + 0.01 * torch.ones_like(v) for k, v in state.items()},
                                     Path(tiny_model_dir), tied=True)
        body = {"path": str(step), "version": 1}
        assert httpx.post(f"{url}/update_weights", json=body, timeout=60).status_code == 401
        wrong = {"Authorization": "Bearer not-the-token"}
        assert httpx.post(f"{url}/update_weights", json=body, headers=wrong, timeout=60).status_code == 401
        health = httpx.get(f"{url}/health").json()
        assert (health["weight_version"], health["updates"], health["unauthorized"]) == (0, 0, 2)
        filesystem.notify_inference([url], step, 1, (keys / TOKEN_FILE).read_text().strip())  # the trainer's way
        assert httpx.get(f"{url}/health").json()["weight_version"] == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)

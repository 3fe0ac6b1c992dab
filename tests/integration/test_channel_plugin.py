"""A loss channel defined in tests/plugins/ (outside the package) trains in a real `trainer` run.

The test plays the orchestrator: it pushes batches over the real ZMQ transport to the real
trainer process (torchrun, FSDP2 on gloo), each a different set of random prefixes followed by
one fixed marked span. The channel's loss at step 0 must equal the initial model's NLL of the
span computed here, it must fall as the policy learns the span in ever new contexts, and the
channel's own checkpointed module must come back from the checkpoint with its count.
"""

import json
import os
import random
import sys

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from composer_prime.contract.batches import Batch, Sample
from composer_prime.trainer.loss import token_logprobs
from composer_prime.trainer.model import load_model
from composer_prime.transports.batches.zmq import BatchSender

from tests.conftest import ROOT, free_port
from tests.support import forkserver

SPAN = [17, 230, 41, 99, 5, 311]
STEPS = 10


def batch(step: int) -> Batch:
    rng = random.Random(step)  # every step new contexts; the span is what there is to learn
    samples = []
    for _ in range(8):
        prefix = [rng.randrange(3, 500) for _ in range(rng.randint(4, 12))]
        ids = prefix + SPAN
        start, end = len(prefix), len(ids)
        samples.append(Sample(ids, [0.0] * end, [0.0] * end, {"span": [0.0] * start + [1.0] * len(SPAN)},
                              channel_data={"span": [start, end]}))
    return Batch(step, samples)


def span_nll(model, b: Batch) -> float:
    total, n = 0.0, 0
    with torch.no_grad():
        for s in b.samples:
            ids = torch.tensor([s.input_ids])
            lp = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:])[0]
            w = torch.tensor(s.channel_weights["span"][1:])
            total, n = total - float((lp * w).sum()), n + int(w.sum())
    return total / n


def train(run, model_dir, batches: list[Batch], *flags: str) -> list[dict]:
    """The real trainer process fed `batches` over ZMQ; its metrics rows."""
    address = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "plugins"), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "composer_prime.entrypoints.trainer", "--model", str(model_dir), "--output_dir", str(run),
           "--max_steps", str(len(batches)), "--inference_urls", "[]", "--transport.address", address,
           "--optim.warmup_steps", "1", "--ckpt.keep_last", "1", *flags]
    proc = forkserver.Popen(cmd, cwd=ROOT, env=env)
    sender = BatchSender(address)
    try:
        for b in batches:
            sender.send(b)
        assert proc.wait(timeout=600) == 0
    finally:
        sender.close()
        if proc.poll() is None:
            proc.kill()
    return [json.loads(ln) for ln in (run / "trainer" / "metrics.jsonl").read_text().splitlines()]


def test_a_channel_from_outside_the_package_trains_in_a_real_trainer(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    rows = train(run, tiny_model_dir, [batch(step) for step in range(STEPS)], "--loss.plugins", '["span_channel:SpanChannel"]',
                 "--loss.weights", "{span = 1.0}", "--loss.span.min_len", "3", "--optim.lr", "3e-3")
    assert [r["step"] for r in rows] == list(range(STEPS))
    losses = [r["loss/span"] for r in rows]
    assert losses[0] == pytest.approx(span_nll(load_model(str(tiny_model_dir)), batch(0)), rel=1e-4)
    assert all(r["trained_tokens"] == 8 * len(SPAN) for r in rows)
    assert losses[-1] < 0.4 * losses[0]  # learned the span, in contexts it had not seen
    assert rows[-1]["span/hits"] > rows[0]["span/hits"]
    saved = tmp_path / "ckpt.pt"
    dcp_to_torch_save(str(run / "checkpoints" / f"step_{STEPS}"), str(saved))
    state = torch.load(saved, weights_only=False)
    assert int(state["span:steps_seen"]["count"]) == STEPS


def test_a_batch_with_nothing_to_train_on_is_counted_and_skipped(tmp_path, tiny_model_dir):
    """A collapsed policy or every turn cut away gives a batch with no weighted token: the trainer
    counts it, keeps its weights, publishes the step, and trains on the next batch (this crashed
    the trainer at backward: 'element 0 of tensors does not require grad')."""
    def rl_batch(step: int, weight: float) -> Batch:
        b = batch(step)
        for s in b.samples:
            s.channel_weights = {"rl": [weight * w for w in s.channel_weights.pop("span")]}
            s.advantages = [0.5 * w for w in s.channel_weights["rl"]]
            s.sampling_logprobs = [-6.0 * w for w in s.channel_weights["rl"]]
            s.channel_data = {}
        return b

    run = tmp_path / "run"
    rows = train(run, tiny_model_dir, [rl_batch(0, 1.0), rl_batch(1, 0.0), Batch(2, []), rl_batch(3, 1.0)])
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r.get("empty_batch", 0) for r in rows] == [0, 1, 1, 0]
    assert [r["trained_tokens"] for r in rows] == [48, 0, 0, 48]
    assert rows[3]["grad_norm"] > 0 and "loss/rl" in rows[3]
    assert (run / "weights" / "step_4" / "STABLE").exists()

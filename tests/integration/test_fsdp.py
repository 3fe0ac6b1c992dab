"""FSDP2 on 2 gloo ranks must compute exactly what one process computes on the same batch: on one
machine, and with each rank on its own emulated host (network namespaces, where neither can reach
the other's loopback)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.support import netem
from tests.conftest import ROOT, free_port


def run(nproc: int, model_dir, out, objectives: dict[str, dict], hosts: netem.Hosts | None = None) -> dict[str, tuple[dict, dict]]:
    """`nproc` ranks under torchrun on loopback, or one rank on each of `hosts` (emulated machines:
    rendezvous at the first one's address, gloo on each host's own interface): one step per objective,
    each from the initial weights, in one launch. Objective -> (metrics, weights)."""
    out.mkdir()
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **os.environ}
    worker = ["tests/support/fsdp_worker.py", str(model_dir), str(out), json.dumps(objectives)]
    if hosts is None:
        subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
                        f"--master-port={free_port()}", *worker], cwd=ROOT, check=True, timeout=600, env=env)
    else:
        first = next(iter(hosts.addr.values()))
        ranks = [subprocess.Popen([*prefix, sys.executable, "-m", "torch.distributed.run", f"--nnodes={nproc}",
                                   f"--node-rank={i}", "--nproc-per-node=1", f"--master-addr={first}", "--master-port=29500",
                                   *worker], cwd=ROOT, env={**env, "GLOO_SOCKET_IFNAME": "eth0"})
                 for i, prefix in enumerate(hosts.prefix.values())]
        assert [r.wait(timeout=600) for r in ranks] == [0] * nproc
    return {name: (json.loads((out / name / "metrics.json").read_text()), load_file(str(out / name / "weights.safetensors")))
            for name in objectives}


# the default objective, and every non-default branch whose normaliser or extra input spans ranks:
# per-sequence means (global sequence count), ratio-band masking, the two-sided clip, k3 KL to a
# frozen reference sharded like the policy; the distill channel, whose teacher forward runs on
# every rank although only one rank holds an error turn
OBJECTIVES = {"default": {},
              "grpo-mask-delta-kl": {"rl": {"norm": "sequence", "off_policy": "mask", "two_sided_delta": 4.0, "kl_coef": 0.1}},
              "rl+distill": {"weights": {"rl": 1.0, "distill": 0.5}},
              "rl+distill-ema": {"weights": {"rl": 1.0, "distill": 0.5}, "distill": {"teacher": "ema", "ema_rate": 0.25}}}


# Weights after the step, 2 ranks against 1 process, element by element (no relative term: rtol
# 1e-4 on a norm weight of 1.0 would allow 1e-4, ten times the step). Measured (2026-11-27, CPU
# gloo): at most 2.1e-8 apart over the four objectives (3.7e-9 default), float32 sums taken in
# another order; the EMA teacher 5.3e-9 apart, and equal to its formula bit for bit.
TOL = 1e-7


@pytest.fixture(scope="module")
def steps(tiny_model_dir, tmp_path_factory) -> tuple[dict, dict, Path]:
    """Every objective's step in one process and on 2 ranks on loopback (a launch each, not one per objective)."""
    d = tmp_path_factory.mktemp("fsdp")
    return run(1, tiny_model_dir, d / "one", OBJECTIVES), run(2, tiny_model_dir, d / "two", OBJECTIVES), d


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_two_ranks_match_one_process(tiny_model_dir, objective, steps):
    (m1, w1), (m2, w2), d = steps[0][objective], steps[1][objective], steps[2]
    assert m2["trained_tokens"] == m1["trained_tokens"]
    assert m2["loss/rl"] == pytest.approx(m1["loss/rl"], rel=1e-4, abs=1e-6)
    # the gradient norm (before clipping) catches a rank-averaging scale error
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-4)
    assert m1["grad_norm"] > 0
    for key in ("masked", "ref_kl", "clipped", "loss/distill"):  # the objective's own statistics agree too
        if key in m1:
            assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-7), key
    if objective == "grpo-mask-delta-kl":
        assert 0 < m1["masked"] < 1  # the band masks some tokens, not all
        assert "ref_kl" in m1
    if objective.startswith("rl+distill"):
        assert m1["loss/distill"] > 0
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    for k in base:
        # Adam's first step moves nearly every element by about lr = 1e-5 (warm-up): the step really
        # changed every tensor, by far more than TOL, so an update one rank drops (its shard, half
        # of each tensor, left as it was) differs from one process's by ~100x TOL and fails below
        assert ((w1[k] - base[k]).abs() > 10 * TOL).float().mean() > 0.99, k
        torch.testing.assert_close(w2[k], w1[k], rtol=0, atol=TOL)
    if objective == "rl+distill-ema":  # teacher <- teacher + 0.25 (policy - teacher), from the initial weights
        t1, t2 = (load_file(str(d / n / objective / "teacher.safetensors")) for n in ("one", "two"))
        for k in base:  # the teacher moves 0.25 x 1e-5, still ~25x TOL
            torch.testing.assert_close(t1[k], base[k] + 0.25 * (w1[k] - base[k]), rtol=0, atol=TOL)
            torch.testing.assert_close(t2[k], t1[k], rtol=0, atol=TOL)
        assert "holds no EMA teacher" in m1["resume_error"] and "holds no EMA teacher" in m2["resume_error"]
        for n in ("one", "two"):  # the checkpoint holds the teacher: a resumed run scores with the same weights
            resumed = load_file(str(d / n / objective / "teacher_resumed.safetensors"))
            assert all(torch.equal(resumed[k], t) for k, t in load_file(str(d / n / objective / "teacher.safetensors")).items())


@pytest.mark.skipif(netem.available() is not None, reason=f"network namespaces: {netem.available()}")
def test_two_ranks_on_two_hosts_match_one_process(tiny_model_dir, tmp_path, steps):
    """Rendezvous (torchrun's store) and gloo between two hosts' own addresses: the step is one
    process's, as on one machine."""
    m1, w1 = steps[0]["default"]
    with netem.switched(["rank0", "rank1"]) as hosts:
        [(m2, w2)] = run(2, tiny_model_dir, tmp_path / "two", {"default": {}}, hosts=hosts).values()
    assert m2["trained_tokens"] == m1["trained_tokens"] and m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-4)
    assert m2["loss/rl"] == pytest.approx(m1["loss/rl"], rel=1e-4, abs=1e-6)
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=0, atol=TOL)

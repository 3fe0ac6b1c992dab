"""Streaming DiLoCo between two real replica processes and a real torchft lighthouse, on loopback.

Each island is tests/support/diloco_worker.py: the tiny model under FSDP2, AdamW inner steps on its
own data, trainer/diloco.py's `Island` around them. What must hold:
- the schedule: with H = 4 and P = 2, a fragment every 2 steps, fragment 0 then 1 (the Manager's
  commits mod P), its all-reduce started τ steps before it is applied (pinned tables below);
- the pseudo-gradient's sign, against arithmetic: with plain outer SGD (momentum 0, lr η) the synced
  fragment is exactly θ_prev − η·mean_i(θ_prev − θ_i), with θ_i each island's weights when the
  fragment's all-reduce started; with η = 1 that is the islands' mean;
- after a sync the synced fragment is bit-identical on both islands while the other one differs;
- every socket either island listens on is on 127.0.0.1.
"""

import json
import subprocess
import sys

import pytest
import torch
from torchft._torchft import LighthouseServer

from tests.conftest import ROOT, free_port

WORKER = ROOT / "tests" / "support" / "diloco_worker.py"
STEPS = 8


def fragment_of(name: str) -> int:
    """Strided, P = 2 (trainer/diloco.fragments): odd decoder layers in fragment 1, the rest in 0."""
    if ".layers." in name:
        return int(name.split(".layers.")[1].split(".")[0]) % 2
    return 0


def launch_islands(tmp_path, model_dir, diloco: dict, steps: int, ranks: int = 1, run: dict | None = None) -> None:
    """Two islands (one process each, or `ranks` under torchrun) and a real lighthouse on loopback;
    each records to tmp_path (diloco_worker.py)."""
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=1000)
    port = lighthouse.address().rpartition(":")[2]  # it advertises the host name: reach it on loopback instead
    diloco = {"islands": 2, "min_islands": 2, "lighthouse": f"127.0.0.1:{port}", **diloco}
    launcher = [] if ranks == 1 else ["-m", "torch.distributed.run", f"--nproc-per-node={ranks}", "--master-addr=127.0.0.1"]
    procs = [subprocess.Popen([sys.executable, *launcher, *([f"--master-port={free_port()}"] if launcher else []), str(WORKER),
                               str(model_dir), str(tmp_path), str(i), json.dumps(diloco), json.dumps({"steps": steps, **(run or {})})],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
        lighthouse.shutdown()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)


def run_islands(tmp_path, diloco: dict, steps: int = STEPS, run: dict | None = None) -> list[dict]:
    launch_islands(tmp_path, tmp_path / "model", diloco, steps, run=run)
    return [torch.load(tmp_path / f"island{i}.pt") for i in range(2)]


@pytest.fixture
def model_dir(tiny_model_dir, tmp_path):
    (tmp_path / "model").symlink_to(tiny_model_dir)
    return tmp_path / "model"


# τ -> per inner step (1-based): the fragment synced after it, and the step whose weights its
# all-reduce carried; torchft: fragment i syncs at ⌊H/P·(i+1)⌋, prepared τ steps before
SCHEDULES = {0: {2: (0, 2), 4: (1, 4), 6: (0, 6), 8: (1, 8)},
             1: {2: (0, 1), 4: (1, 3), 6: (0, 5), 8: (1, 7)}}
WIRE = {"float32": (torch.float32, 4), "bfloat16": (torch.bfloat16, 2)}  # the dtype on the wire, bytes per value


@pytest.mark.parametrize("lr,delay,wire", [(0.5, 0, "float32"), (1.0, 1, "float32"), (1.0, 0, "bfloat16")])
def test_two_islands_sync_fragments_on_schedule_with_the_pinned_arithmetic(model_dir, tmp_path, lr, delay, wire):
    a, b = run_islands(tmp_path, {"sync_every": 4, "fragments": 2, "delay": delay, "outer_lr": lr,
                                  "outer_momentum": 0.0, "alpha": 0.0, "wire_dtype": wire})
    dtype, width = WIRE[wire]
    names = list(a["initial"])
    numel = [sum(a["initial"][n].numel() for n in names if fragment_of(n) == f) for f in (0, 1)]
    for rec in (a, b):
        assert rec["listening"] and all(addr.startswith("127.0.0.1:") for addr in rec["listening"]), rec["listening"]
        assert rec["outer_step"] == [0, 1, 1, 2, 2, 3, 3, 4]  # one commit per synced fragment
        syncs = {i + 1: m for i, m in enumerate(rec["metrics"]) if m.get("diloco/syncs")}
        assert {s: int(m["diloco/fragment"]) for s, m in syncs.items()} == {s: f for s, (f, _) in SCHEDULES[delay].items()}
        for m in syncs.values():
            assert (m["diloco/committed"], m["diloco/participants"]) == (1, 2)
            assert m["diloco/bytes"] == width * numel[int(m["diloco/fragment"])]  # the payload, in the wire's dtype
    theta_prev = dict(a["initial"])  # the last synced value per parameter (both islands start equal)
    assert all(torch.equal(a["initial"][n], b["initial"][n]) for n in names)
    for step, (frag, carried) in SCHEDULES[delay].items():
        after_a, after_b = a["after"][step - 1], b["after"][step - 1]
        for n in [n for n in names if fragment_of(n) == frag]:
            local_a, local_b = a["local"][carried - 1][n], b["local"][carried - 1][n]
            # Δ_i = θ_prev − θ_i on the wire in its dtype, summed and halved there (torchft's AVG), back in float32
            delta = (((theta_prev[n] - local_a).to(dtype) + (theta_prev[n] - local_b).to(dtype)) / 2).float()
            expected = theta_prev[n] - lr * delta
            assert torch.equal(after_a[n], after_b[n]), n  # bit-identical on both islands
            torch.testing.assert_close(after_a[n], expected, rtol=0, atol=2e-6)
            if lr == 1.0 and wire == "float32":
                torch.testing.assert_close(after_a[n], (local_a + local_b) / 2, rtol=0, atol=2e-6)
            theta_prev[n] = after_a[n]
        others = [n for n in names if fragment_of(n) != frag]
        assert not all(torch.equal(after_a[n], after_b[n]) for n in others)  # trained apart since its last sync


def test_islands_of_two_ranks_each_sync_their_shards(model_dir, tmp_path):
    """An island is FSDP2 over its own ranks (torchrun): each rank is a torchft replica group rank,
    all-reducing its own shards with the same rank of the other island. After a sync of fragment
    0 every rank's shard of it is bit-identical across islands and equals θ_prev − η·mean(Δ)."""
    launch_islands(tmp_path, model_dir, {"sync_every": 4, "fragments": 2, "outer_lr": 0.5, "outer_momentum": 0.0}, 2, ranks=2)
    for rank in (0, 1):
        a, b = (torch.load(tmp_path / f"island{i}-rank{rank}.pt") for i in (0, 1))
        assert a["outer_step"] == b["outer_step"] == [0, 1]
        assert a["metrics"][1]["diloco/participants"] == 2
        for n in [n for n in a["initial"] if fragment_of(n) == 0]:
            delta = ((a["initial"][n] - a["local"][1][n]) + (a["initial"][n] - b["local"][1][n])) / 2
            assert torch.equal(a["after"][1][n], b["after"][1][n]), (rank, n)
            torch.testing.assert_close(a["after"][1][n], a["initial"][n] - 0.5 * delta, rtol=0, atol=2e-6)
        others = [n for n in a["initial"] if fragment_of(n) == 1]
        assert not all(torch.equal(a["after"][1][n], b["after"][1][n]) for n in others)


@pytest.mark.gpu
def test_islands_on_gpus_sync_over_nccl_with_the_quantized_wire(model_dir, tmp_path):
    """The GPU's wire: each island on its own GPU, all-reducing over NCCL in torchft's FP8 (one byte
    a value). The synced fragment is bit-identical on both islands and within FP8's rounding of the
    exact θ_prev − η·mean(Δ), yet not equal to it (a wire that quietly sent float32 fails here);
    the other fragment differs. NCCL refuses two ranks on one GPU, so this needs two GPUs."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: NCCL refuses two islands on one device")
    a, b = run_islands(tmp_path, {"sync_every": 4, "fragments": 2, "outer_lr": 1.0, "outer_momentum": 0.0,
                                  "alpha": 0.0, "wire_dtype": "quantized"}, steps=2, run={"device": "cuda"})
    names = [n for n in a["initial"] if fragment_of(n) == 0]
    assert a["metrics"][1]["diloco/bytes"] == sum(a["initial"][n].numel() for n in names)  # FP8: a byte a value
    all_exact = True
    for n in names:
        mean_delta = ((a["initial"][n] - a["local"][1][n]) + (a["initial"][n] - b["local"][1][n])) / 2
        expected = a["initial"][n] - mean_delta
        assert torch.equal(a["after"][1][n], b["after"][1][n]), n
        # e4m3 keeps 3 mantissa bits (≤ 6.25% per rounding); torchft rounds twice (before and after the sum)
        err = (a["after"][1][n] - expected).abs().max().item()
        assert err <= 0.13 * mean_delta.abs().max().item() + 1e-7, (n, err)
        all_exact &= torch.equal(a["after"][1][n], expected)
    assert not all_exact  # the values really went through FP8
    assert not all(torch.equal(a["after"][1][n], b["after"][1][n]) for n in a["initial"] if fragment_of(n) == 1)

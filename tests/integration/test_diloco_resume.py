"""An island resumed from its checkpoint with no peer to heal from continues exactly.

The heal test (test_diloco_heal.py) restarts an island next to a live peer whose heal overwrites
everything the checkpoint restored, so it cannot show the checkpoint's outer state (the Manager's
step, each fragment's θ_prev and outer momentum: trainer/diloco.py's `_Checkpointed`) is right.
Here one island runs alone (quorum of one, a real torchft lighthouse on loopback, the replica a
tests/support/diloco_worker.py process), once straight through and once killed with SIGKILL right
after a checkpoint, then restarted from it; every step after the resume must equal the straight
run's bit for bit, weights before and after each sync and the outer step.

Why these numbers: H = 4, P = 2 syncs a fragment every 2 steps (0, 1, 0, ...), each committed.
The crash comes after step 6, outer step 3: both fragments have synced, so both outer momenta are
nonzero, and fragment 1's θ_prev (from step 4) is not the model's fragment 1 (trained 2 steps
since). The syncs at steps 8, 10 and 12 use that state, and which fragment syncs next follows the
outer step (odd: fragment 1), so a checkpoint that loses any of it changes the weights. (dcp.load
fills θ_prev and the momenta in place, through the live tensors `state_dict` hands it; this checks
the outcome, whichever of the two restores them.)
"""

import json
import subprocess
import sys

import torch
from torchft._torchft import LighthouseServer

from tests.conftest import ROOT
from tests.support.diloco_worker import __file__ as WORKER

STEPS, CRASH = 12, 6
DILOCO = {"islands": 1, "min_islands": 1, "sync_every": 4, "fragments": 2, "timeout_s": 5.0}


def lighthouse() -> tuple[LighthouseServer, str]:
    house = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=500, heartbeat_timeout_ms=1000)
    return house, f"127.0.0.1:{house.address().rpartition(':')[2]}"  # it advertises the host name: use loopback


def start(out, model_dir, address: str, run: dict) -> subprocess.Popen:
    out.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, WORKER, str(model_dir), str(out), "0",
                             json.dumps({**DILOCO, "lighthouse": address}), json.dumps(run)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_an_island_resumed_alone_from_its_checkpoint_continues_bit_for_bit(tiny_model_dir, tmp_path):
    (house, address), (house2, address2) = lighthouse(), lighthouse()  # two runs at once: a lighthouse each
    straight = start(tmp_path / "straight", tiny_model_dir, address, {"steps": STEPS})
    doomed = start(tmp_path / "crashed", tiny_model_dir, address2, {"steps": STEPS, "ckpt_every": CRASH, "die_after": CRASH})
    procs = [straight, doomed]
    try:
        out = doomed.communicate(timeout=120)[0]
        assert doomed.returncode == -9, out[-3000:]  # it killed itself: SIGKILL, not an exit
        resumed = start(tmp_path / "crashed", tiny_model_dir, address2, {"steps": STEPS - CRASH, "ckpt_every": CRASH})
        procs.append(resumed)
        outs = [p.communicate(timeout=120)[0] for p in (straight, resumed)]
        assert [straight.returncode, resumed.returncode] == [0, 0], "\n".join(o[-3000:] for o in outs)
    finally:
        for p in procs:
            p.kill()
        house.shutdown()
        house2.shutdown()
    a, b = (torch.load(tmp_path / d / "island0.pt") for d in ("straight", "crashed"))
    assert b["resumed_from"] == CRASH and len(b["after"]) == STEPS - CRASH
    # the schedule the docstring relies on: a committed sync every 2 steps, fragments in turn
    syncs = [(i + 1, m["diloco/fragment"]) for i, m in enumerate(a["metrics"]) if m.get("diloco/committed")]
    assert syncs == [(s, (s // 2 - 1) % 2) for s in range(2, STEPS + 1, 2)]
    names = list(a["initial"])
    assert all(torch.equal(b["initial"][n], a["after"][CRASH - 1][n]) for n in names)  # the model as it was saved
    for k in range(STEPS - CRASH):  # every later step: the island's own weights, then after any sync
        for rec in ("local", "after"):
            diff = [n for n in names if not torch.equal(b[rec][k][n], a[rec][CRASH + k][n])]
            assert not diff, f"step {CRASH + k + 1} ({rec}): {len(diff)} tensors differ from the straight run, e.g. {diff[0]}"
    assert b["outer_step"] == a["outer_step"][CRASH:]  # and the Manager's step came back (checked last: the weights say more)

"""An island killed mid-run and restarted heals from a live peer; the survivor never stops.

Two replica processes (tests/support/diloco_worker.py) and a real torchft lighthouse on loopback,
`min_islands = 1`. Island 1 checkpoints every 4 steps and is killed with SIGKILL once it has one;
island 0 goes on syncing alone (quorum of 1, every round committed). Island 1 is started again
with the same command: it resumes from its checkpoint, finds itself behind at its first quorum and
heals from island 0 (model, inner AdamW, each fragment's θ_prev and outer momentum), after which
the two are bit-identical, whole model, at the same outer step; and every sync of both after that
leaves the fragment it synced bit-identical on both (the other fragment is each island's own).
The checkpoint's outer state is overwritten by the heal here: test_diloco_resume.py tests it alone.
"""

import json
import signal
import subprocess
import sys
import time

import torch
from torchft._torchft import LighthouseServer

from composer_prime.trainer.diloco import fragments
from composer_prime.trainer.model import load_model
from tests.conftest import ROOT
from tests.support.diloco_worker import __file__ as WORKER

DILOCO = {"islands": 2, "min_islands": 1, "sync_every": 4, "fragments": 2, "timeout_s": 5.0}


def start(tmp_path, model_dir, island: int, lighthouse: str, run: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, WORKER, str(model_dir), str(tmp_path), str(island),
                             json.dumps({**DILOCO, "lighthouse": lighthouse}), json.dumps(run)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def fragment_names(model_dir) -> list[set[str]]:
    """Each fragment's parameter names, from the split the islands use (trainer/diloco.py)."""
    model = load_model(str(model_dir))
    names = {id(p): n for n, p in model.named_parameters()}
    return [{names[id(p)] for p in part.parameters()} for part in fragments(model, DILOCO["fragments"], "strided")]


def test_killed_island_heals_from_a_live_peer_and_the_survivor_keeps_committing(tiny_model_dir, tmp_path):
    house = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=500, heartbeat_timeout_ms=1000)
    lighthouse = f"127.0.0.1:{house.address().rpartition(':')[2]}"
    stop = tmp_path / "stop"  # the survivor trains until the restarted island is done
    survivor = start(tmp_path, tiny_model_dir, 0, lighthouse, {"steps": 10_000, "pause": 0.25, "until": str(stop),
                                                               "snapshots": "syncs"})
    doomed = start(tmp_path, tiny_model_dir, 1, lighthouse, {"steps": 10_000, "pause": 0.25, "ckpt_every": 4,
                                                             "snapshots": "syncs"})
    procs = [survivor, doomed]
    try:
        deadline = time.time() + 240
        while not (tmp_path / "ckpt-island1" / "step_8" / "DONE").exists():
            assert time.time() < deadline and doomed.poll() is None, doomed.communicate()[0][-3000:]
            time.sleep(0.2)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        time.sleep(4)  # the survivor alone for a while
        restarted = start(tmp_path, tiny_model_dir, 1, lighthouse, {"steps": 24, "pause": 0.25, "ckpt_every": 4,
                                                                    "snapshots": "syncs"})
        procs.append(restarted)
        outs = [restarted.communicate(timeout=300)[0]]
        stop.touch()
        outs.append(survivor.communicate(timeout=120)[0])
        assert [restarted.returncode, survivor.returncode] == [0, 0], "\n".join(o[-3000:] for o in outs)
    finally:
        for p in procs:
            p.kill()
        house.shutdown()
    a, b = (torch.load(tmp_path / f"island{i}.pt") for i in (0, 1))
    assert b["resumed_from"] is not None and b["resumed_from"] >= 8
    syncs_a = [m for m in a["metrics"] if m.get("diloco/syncs")]
    assert any(m["diloco/participants"] == 1 and m["diloco/committed"] == 1 for m in syncs_a)  # alone, still committing
    assert a["outer_step"] == sorted(a["outer_step"]) and a["outer_step"][-1] > 12
    [heal] = [i for i, m in enumerate(b["metrics"]) if m.get("diloco/heals")]
    first = next(i for i in range(heal, len(b["metrics"])) if b["metrics"][i].get("diloco/committed"))
    assert b["metrics"][first]["diloco/participants"] == 2
    step = b["outer_step"][first]
    j = a["outer_step"].index(step)  # the survivor's step after the same sync
    assert all(torch.equal(b["after"][first][n], a["after"][j][n]) for n in a["initial"])
    # and from there on the islands sync together: every later commit of the restarted island had both,
    # and each one left the fragment it synced the same on both islands, not only the first after the heal
    assert all(m["diloco/participants"] == 2 for m in b["metrics"][first:] if m.get("diloco/syncs"))
    parts = fragment_names(tiny_model_dir)
    later = [i for i in range(first + 1, len(b["metrics"])) if b["metrics"][i].get("diloco/committed")]
    assert len(later) >= 4, b["metrics"]  # the restarted island's 24 steps hold a dozen syncs
    for i in later:
        j = a["outer_step"].index(b["outer_step"][i])  # the survivor's commit of the same round
        fragment = int(b["metrics"][i]["diloco/fragment"])
        assert a["metrics"][j].get("diloco/committed") and a["metrics"][j]["diloco/fragment"] == fragment
        diff = [n for n in parts[fragment] if not torch.equal(b["after"][i][n], a["after"][j][n])]
        assert not diff, f"outer step {b['outer_step'][i]}: fragment {fragment} differs in {len(diff)} tensors, e.g. {diff[0]}"
        # while the fragment not synced is each island's own: the islands are not simply identical
        assert any(not torch.equal(b["after"][i][n], a["after"][j][n]) for n in parts[1 - fragment])

"""One island's trainer reduced to its DiLoCo replica, run as its own process by the DiLoCo tests.

`python tests/support/diloco_worker.py MODEL_DIR OUT ISLAND DILOCO_JSON RUN_JSON`: the tiny model
sharded by FSDP2 on a one-rank process group (or on torchrun's ranks: then each rank records its
own shards in OUT/island{ISLAND}-rank{RANK}.pt), AdamW as the inner optimizer, and trainer/diloco.py's
`Island` around RUN_JSON's `steps` inner steps on this island's own random batches (seeded by ISLAND
and `seed`; a resumed island first skips the batches of the steps its checkpoint holds, so it draws
what a run without the crash would have), `pause` seconds after each, stopping early once the file
`until` exists (an island kept alive while another restarts); `snapshots` "syncs" keeps the weights
only after syncs; `device` "cuda" puts island i on GPU i (its one-rank group on NCCL), so the islands
all-reduce over NCCL, which refuses two ranks on one GPU: that needs a GPU per island; with `one_gpu` too,
every island is on GPU 0 and the islands' group is gloo, CUDA tensors staged through host memory
(tests/support/diloco_one_gpu.py).
Before DiLoCo's hooks see each step, the parameters are recorded (the island's θ_local); after the
step returns, again (after any sync), with the Manager's step and the island's metrics. Also the
process's listening sockets once the replica is up. Everything goes to OUT/island{ISLAND}.pt.
With `ckpt_every`, the island checkpoints (model, optimizer, outer state) every that many steps
and, when OUT holds its checkpoint from a run before, resumes from it first (a restarted island).
With `die_after` too, the process SIGKILLs itself right after that step's checkpoint: a real crash,
at a known step rather than wherever a test's signal happens to land; it records nothing.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import psutil
import torch
import torch.distributed as dist

from composer_prime.config import TrainerConfig
from composer_prime.trainer import checkpoint
from composer_prime.trainer.diloco import Island
from composer_prime.trainer.model import load_model, shard
from composer_prime.trainer.parallel import ParallelDims, dp_mesh
from tests.support.diloco_one_gpu import HostStagedGloo


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.data.to_local().detach().cpu().clone() for n, p in model.named_parameters()}


def listening() -> list[str]:
    return sorted(f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.Process().net_connections("inet") if c.status == "LISTEN")


def main(model_dir: str, out: str, island: int, diloco: str, run: str) -> None:
    opts = {"steps": 8, "seed": 0, "pause": 0.0, "ckpt_every": 0, "die_after": None, "until": None,
            "snapshots": "all", "device": "cpu", "one_gpu": False} | json.loads(run)
    device = opts["device"]
    if device == "cuda":
        torch.cuda.set_device(0 if opts["one_gpu"] else island)
    if "WORLD_SIZE" in os.environ:  # an island of several ranks, under torchrun
        dist.init_process_group("gloo")
    else:
        backend = "nccl" if device == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank()
    torch.set_num_threads(1)
    cfg = TrainerConfig(diloco={**json.loads(diloco), "island": island})
    torch.manual_seed(0)  # the same initial weights on every island
    model = shard(load_model(model_dir).to(device), dp_mesh(ParallelDims.of_world(1).build(device)))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ckpt = Path(out) / f"ckpt-island{island}"
    pg = HostStagedGloo(timeout=timedelta(seconds=cfg.diloco.timeout_s)) if opts["one_gpu"] else None
    hook = Island(cfg, SimpleNamespace(model=model, optim=optim), pg)
    resumed = checkpoint.latest(ckpt)
    if resumed:
        checkpoint.load(resumed[1], model, optim, hook.state())
    rec = {"listening": listening(), "initial": snapshot(model), "local": [], "after": [], "outer_step": [],
           "metrics": [], "resumed_from": resumed[0] if resumed else None}
    every = opts["snapshots"] == "all"  # else only the weights after a sync or a heal (a long run's memory)
    optim.register_step_post_hook(lambda *_: rec["local"].append(snapshot(model) if every else None))  # before DiLoCo's
    done = resumed[0] if resumed else 0
    gen = torch.Generator().manual_seed(1000 * opts["seed"] + 10 * rank + island)  # each island's (rank's) own data
    vocab = model.config.vocab_size
    for _ in range(done):  # the checkpoint's steps trained on these: go on where they stopped
        torch.randint(0, vocab, (4, 16), generator=gen)
    with hook:
        for step in range(done + 1, done + opts["steps"] + 1):
            if opts["until"] and Path(opts["until"]).exists():
                break
            ids = torch.randint(0, vocab, (4, 16), generator=gen).to(device)
            optim.zero_grad()
            model(input_ids=ids, labels=ids).loss.backward()
            optim.step()
            rec["outer_step"].append(hook.manager.current_step())
            rec["metrics"].append(hook.metrics())
            rec["after"].append(snapshot(model) if every or rec["metrics"][-1].get("diloco/syncs") else None)
            if opts["ckpt_every"] and step % opts["ckpt_every"] == 0:
                checkpoint.save(ckpt, step, model, optim, 1, hook.state())
                if step == opts["die_after"]:  # no exit handler, no flush: as if the machine went away
                    os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(opts["pause"])
    torch.save(rec, Path(out) / (f"island{island}.pt" if dist.get_world_size() == 1 else f"island{island}-rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])

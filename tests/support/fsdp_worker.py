"""Run under torchrun by test_fsdp.py: for each objective given, one trainer step on a fixed batch from the
initial weights, and what it produced dumped under <out>/<objective>/ (all objectives in one process group:
one launch, not one per objective)."""

import gc
import json
import random
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from composer_prime.config.models import TrainerConfig
from composer_prime.contract.batches import Batch, Sample
from composer_prime.contract.distill import Teacher
from composer_prime.trainer import checkpoint
from composer_prime.trainer.loss import Context, Objective
from composer_prime.trainer.model import frozen_copy, full_state_dict, load_model, shard
from composer_prime.trainer.parallel import ParallelDims, dp_mesh
from composer_prime.trainer.train import train_step


def fixed_batch(distill: bool) -> Batch:
    """12 samples; with `distill`, sample 0 alone has an error turn with a hinted teacher, so one
    rank has teachers and the other none (its teacher forwards must still match in number)."""
    rng = random.Random(0)
    samples = []
    for i in range(12):
        n_prompt, n_out = rng.randint(5, 20), rng.randint(2, 12)
        ids = [rng.randrange(3, 500) for _ in range(n_prompt + n_out)]
        adv = rng.uniform(-1, 1)
        # sampling log-probs around the tiny model's own (~ -ln 512): ratios pi_old/mu land both in and out of the mask band
        s = Sample(ids, [0.0] * n_prompt + [rng.uniform(-8.0, -4.5) for _ in range(n_out)],
                   [0.0] * n_prompt + [adv] * n_out, {"rl": [0.0] * n_prompt + [1.0] * n_out})
        if distill:
            hint = [rng.randrange(3, 500) for _ in range(4)] if i == 0 else []
            if i == 0:
                s.channel_data["distill"] = [Teacher(ids[:n_prompt] + hint + ids[n_prompt:], n_prompt + len(hint), n_prompt, n_out)]
            s.channel_weights["distill"] = [0.0] * n_prompt + [float(i == 0)] * n_out
        samples.append(s)
    return Batch(step=0, samples=samples)


def dump(model, path: str) -> None:
    state = full_state_dict(model)  # collective
    if dist.get_rank() == 0:
        save_file({k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"}, path)  # tied


def main(model_dir: str, out: str, objectives: str) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    for name, loss in json.loads(objectives).items():
        (Path(out) / name).mkdir(parents=True, exist_ok=True)
        step(model_dir, f"{out}/{name}", json.dumps(loss))
        gc.collect()
    gc.collect()  # the sharded models (which hold the process group's work) go before gloo is torn down
    dist.barrier()  # neither rank tears gloo down while the other may still be talking to it
    dist.destroy_process_group()


def step(model_dir: str, out: str, loss: str) -> None:
    cfg = TrainerConfig(micro_batch_tokens=64, loss=json.loads(loss))
    mesh = dp_mesh(ParallelDims.of_world(1).build("cpu"))
    model = shard(load_model(model_dir), mesh)
    objective = Objective(cfg.loss, Context(model, model_dir, pad_id=0))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = fixed_batch("distill" in cfg.loss.weights)
    objective.check(batch)  # as on arrival
    metrics = train_step(cfg, model, optim, batch, objective, pad_id=0)
    dump(model, f"{out}/weights.safetensors")
    extra = objective.modules()
    if extra:  # the EMA teacher after its update, and as a resumed run reads it back from a checkpoint
        (label, ema), = extra.items()
        dump(ema, f"{out}/teacher.safetensors")
        checkpoint.save(Path(out) / "ckpt", 1, model, optim, keep_last=1, extra=extra)
        fresh = {label: frozen_copy(model_dir, mesh)}
        checkpoint.load(Path(out) / "ckpt" / "step_1", model, optim, fresh)
        dump(fresh[label], f"{out}/teacher_resumed.safetensors")
        checkpoint.save(Path(out) / "ckpt", 2, model, optim, keep_last=2)  # a run started without the EMA teacher
        try:
            checkpoint.load(Path(out) / "ckpt" / "step_2", model, optim, fresh)
        except SystemExit as e:
            metrics["resume_error"] = str(e)
    if dist.get_rank() == 0:
        with open(f"{out}/metrics.json", "w") as f:
            json.dump(metrics, f)


if __name__ == "__main__":
    main(*sys.argv[1:])

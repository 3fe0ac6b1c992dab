"""Run under torchrun by test_fsdp.py: one trainer step on a fixed batch, dump what it produced."""

import json
import random
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from composer_prime.config.models import TrainerConfig
from composer_prime.trainer.model import full_state_dict, load_model, shard
from composer_prime.trainer.train import train_step
from composer_prime.transports.batches.schema import Batch, Sample


def fixed_batch() -> Batch:
    rng = random.Random(0)
    samples = []
    for i in range(12):
        n_prompt, n_out = rng.randint(5, 20), rng.randint(2, 12)
        ids = [rng.randrange(3, 500) for _ in range(n_prompt + n_out)]
        adv = rng.uniform(-1, 1)
        # sampling log-probs around the tiny model's own (~ -ln 512): ratios pi_old/mu land both in and out of the mask band
        samples.append(Sample(ids, [0.0] * n_prompt + [rng.uniform(-8.0, -4.5) for _ in range(n_out)],
                              [0.0] * n_prompt + [adv] * n_out, {"rl": [0.0] * n_prompt + [1.0] * n_out}))
    return Batch(step=0, samples=samples)


def main(model_dir: str, out: str, rl_loss: str = "{}") -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    cfg = TrainerConfig(micro_batch_tokens=64, loss={"rl": json.loads(rl_loss)})
    model = shard(load_model(model_dir))
    ref = shard(load_model(model_dir)).eval() if cfg.loss.rl.kl_coef > 0 else None
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metrics = train_step(cfg, model, optim, fixed_batch(), pad_id=0, ref_model=ref)
    state = full_state_dict(model)
    if dist.get_rank() == 0:
        save_file({k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"}, f"{out}/weights.safetensors")  # tied
        with open(f"{out}/metrics.json", "w") as f:
            json.dump(metrics, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])

"""The trainer: one optimizer step over a batch's loss channels, and the loop around it.

`join`, `build`, `fit` and `train_step` are the trainer whatever feeds it: `run` (the `trainer`
process of `rl`, in every rank under torchrun) trains on the orchestrator's batches, received
over ZMQ by rank 0, then checkpoints and publishes each new policy; `sft` (trainer/sft.py) trains
on a local dataset. FSDP2 on gloo (CPU) or NCCL (GPU).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from composer_prime.config import TrainerConfig
from composer_prime.contract.batches import Batch
from composer_prime.model.optim import build_optimizer, set_lr
from composer_prime.model.resolve import resolve_model
from composer_prime.trainer import checkpoint, outer_sync
from composer_prime.trainer.data import collate, pack
from composer_prime.trainer.prefix import sharable
from composer_prime.trainer.loss import Context, Counts, LossInputs, Objective, token_logprobs
from composer_prime.trainer.model import compute_dtype, device_type, full_state_dict, load_model, shard
from composer_prime.trainer.parallel import ParallelDims, dp_mesh
from composer_prime.trainer.sources import BatchSource, ZmqSource
from composer_prime.transports import auth
from composer_prime.transports.batches.zmq import BatchReceiver
from composer_prime.transports.weights import filesystem
from composer_prime.transports.weights.publish import FilesystemPublisher, Publisher, ShardcastPublisher
from composer_prime.utils.metrics import MetricsLog
from composer_prime.utils.run_dir import new_id


log = logging.getLogger(__name__)  # ranks other than 0 are quiet (entrypoints.trainer): one voice, not world_size


@dataclass
class Trainer:
    """What `fit` trains: the sharded policy, its optimizer and objective, and where the weights came from."""

    cfg: TrainerConfig
    model: torch.nn.Module
    optim: torch.optim.Optimizer
    objective: Objective
    pad_id: int
    model_dir: str


def join(cfg: TrainerConfig) -> str:
    """Join the process group: torchrun's (from its environment), else a group of this one process
    over an in-memory store (no port to find). One thread per process on CPU, a GPU per rank on CUDA."""
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device_type() == "cuda" else "gloo")
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if device_type() == "cpu":
        torch.set_num_threads(1)  # one thread per process: on few cores more threads decode slower
    else:
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    return backend


def build(cfg: TrainerConfig) -> Trainer:
    """The policy in float32 (the master weights), sharded and computing in `cfg.compute_dtype`; its
    objective and its optimizer (model/optim.py). Every rank takes part."""
    box = [resolve_model(cfg.model) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    model_dir = box[0]
    torch.manual_seed(cfg.seed)
    dtype = compute_dtype(cfg.compute_dtype)
    mesh = ParallelDims.of_world(cfg.dp_replicate).build(device_type())
    model = shard(load_model(model_dir), dp_mesh(mesh), dtype)
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    objective = Objective(cfg.loss, Context(model, model_dir, pad_id, shared_row_cap(cfg, model), dtype))
    return Trainer(cfg, model, build_optimizer(model.parameters(), cfg.optim), objective, pad_id, model_dir)


def fit(t: Trainer, source: BatchSource, start: int, after: Callable[[int, dict[str, float]], None]) -> None:
    """Steps `start`..max_steps-1: the step's batch from `source`, one `train_step` on it, then
    `after(step, metrics)`: what the run does with a step (log it, checkpoint, publish)."""
    for step in range(start, t.cfg.max_steps):
        t_wait = time.time()
        batch = source.batch(step, t.objective)
        t0 = time.time()
        metrics = train_step(t.cfg, t.model, t.optim, batch, t.objective, t.pad_id)
        compute_s = time.time() - t0
        after(step, {"compute_s": compute_s, "wait_s": t0 - t_wait, **metrics,
                     "tokens_per_s": metrics["trained_tokens"] / max(compute_s, 1e-9)})


def published_dtype(cfg: TrainerConfig) -> torch.dtype:
    """The dtype of the weights published for inference: `weight_broadcast.dtype`, or with "auto" the
    compute dtype, which is what inference serves (bfloat16 on CUDA, float32 on CPU); never the
    float32 master copy's by default on a GPU."""
    wb = cfg.weight_broadcast.dtype
    return compute_dtype(cfg.compute_dtype if wb == "auto" else wb)


def publish(cfg: TrainerConfig, model: torch.nn.Module, model_dir: str, step: int, publisher: Publisher | None,
            checkpointed: int, run: str | None = None) -> None:
    """Write and announce weights/step_N of run `run` (its id); pruning keeps that run's newest steps and
    spares the newest checkpoint's (`checkpointed`)."""
    state = full_state_dict(model)  # collective: every rank takes part
    if publisher is not None:
        root = Path(cfg.output_dir) / "weights"
        path = filesystem.write_step(root, step, state, Path(model_dir), model.config.tie_word_embeddings,
                                     published_dtype(cfg), run)
        publisher.publish(step, path)
        filesystem.prune(root, cfg.weight_broadcast.keep_last, checkpointed, run)
    dist.barrier()


def make_publisher(cfg: TrainerConfig) -> Publisher:
    wb = cfg.weight_broadcast
    if wb.type == "shardcast":
        return ShardcastPublisher(cfg.signing_key(), Path(cfg.output_dir) / "shardcast", wb.host, wb.port, wb.shard_size,
                                  wb.keep_last, wb.delta, cfg.inference_urls)
    return FilesystemPublisher(cfg.inference_urls, auth.token(cfg.auth.keys_dir))


def shared_row_cap(cfg: TrainerConfig, model: torch.nn.Module) -> int | None:
    """The longest row of shared prefixes (a micro-batch's budget), or None where rows are not shared."""
    return cfg.micro_batch_tokens if cfg.share_prefix and sharable(model) else None


def train_step(cfg: TrainerConfig, model, optim, batch: Batch, objective: Objective, pad_id: int) -> dict[str, float]:
    """One optimizer step over the channels active in `batch`. A batch with no weighted token in
    any channel (every group flat or stale, every turn cut away) is counted and skipped on every
    rank alike: no forward, no optimizer step, the weights stay as they are."""
    world, rank = dist.get_world_size(), dist.get_rank()
    counts = Counts.of(batch)
    active = objective.active(counts)  # decided on the whole batch: the same on every rank
    if not active:
        return {"trained_tokens": 0.0, "grad_norm": 0.0, "empty_batch": 1.0}
    for ch in active:
        ch.begin(batch)
    channels = sorted(counts.tokens)
    t = time.time()
    share_cap = shared_row_cap(cfg, model)
    micro_batches = pack(batch.samples, cfg.micro_batch_tokens, world, share_cap)[rank]
    clock = {"pack_s": time.time() - t, "forward_s": 0.0, "backward_s": 0.0}  # this rank's own times
    optim.zero_grad(set_to_none=True)
    lr = set_lr(optim, cfg.optim, batch.step, cfg.max_steps)  # a pure function of the step: resumed runs agree
    sums: dict[str, torch.Tensor] = {}
    tokens = 0
    for samples in micro_batches:
        t = time.time()
        mb = collate(samples, pad_id, channels, device_type(), share_cap)
        clock["pack_s"] += time.time() - t
        t = time.time()
        logits = mb.logits(model)
        lp = token_logprobs(logits, mb.input_ids[:, 1:], mb.temperature)
        # One optimizer step per batch, so pi_old is the current policy, detached.
        x = LossInputs(lp, lp.detach(), mb.sampling_logprobs, mb.advantages, logits)
        prepared = {ch.name: ch.prepare(mb, x) for ch in active}
        loss, stats = objective.loss(x, mb.channel_weights, counts, prepared)
        clock["forward_s"] += time.time() - t
        t = time.time()
        # FSDP2 averages gradients over ranks; each rank's loss is a share of a global sum, so undo the mean.
        (loss * world).backward()
        clock["backward_s"] += time.time() - t
        with torch.no_grad():
            mask = sum(mb.channel_weights.values()) != 0
            probs = torch.softmax(logits.float() / mb.temperature, -1)
            stats["entropy"] = (-(probs * torch.log(probs + 1e-12)).sum(-1) * mask).sum() / max(1, sum(counts.tokens.values()))
        for k, v in stats.items():
            sums[k] = sums.get(k, 0) + v.detach().float()
        tokens += int(mask.sum())
    t = time.time()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.max_norm)
    optim.step()
    objective.after_step()
    clock["optim_s"] = time.time() - t
    keys = sorted(sums)
    vec = torch.tensor([float(sums[k]) for k in keys] + [float(tokens)], device=device_type())  # NCCL reduces GPU tensors only
    dist.all_reduce(vec)
    out = {k: vec[i].item() for i, k in enumerate(keys)}
    out["trained_tokens"] = vec[-1].item()
    out["grad_norm"] = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    return out | clock | {"lr": lr}


def resume_point(cfg: TrainerConfig) -> tuple[int, Path | None, str]:
    """(first step, checkpoint to load or None, run id), as rank 0 finds them in output_dir and every rank
    agrees. A rank that cannot see that checkpoint (nodes that do not share output_dir) stops every rank
    in one line, rather than leaving the others waiting in a collective for it."""
    decided: list = [None]
    if dist.get_rank() == 0:
        run = Path(cfg.output_dir)
        start, path, run_id, error = 0, None, cfg.run_id, None
        if cfg.resume and (found := checkpoint.resumable(run / "checkpoints", cfg.run_id)):
            start, path, run_id = found
        elif not cfg.resume and (other := checkpoint.latest(run / "checkpoints")):  # rl refuses this before any start
            error = (f"{run} holds the checkpoints of another run (newest {other[1].name}): resume it, or start in "
                     "another output_dir")
        decided = [(start, str(path) if path else None, run_id or new_id(), error)]
    dist.broadcast_object_list(decided, src=0)
    start, path, run_id, error = decided[0]
    if error:
        raise SystemExit(error)
    seen = torch.tensor([float(path is None or Path(path).is_dir())], device=device_type())
    dist.all_reduce(seen, op=dist.ReduceOp.MIN)
    if not seen.item():
        raise SystemExit(f"trainer.nodes: {path} is missing on some nodes: every node's output_dir must be the same "
                         "shared directory")
    return start, Path(path) if path else None, run_id


def run(cfg: TrainerConfig) -> None:
    """One rank of `rl`'s trainer: join the process group, resume if asked, train on the orchestrator's
    batches to `max_steps`, checkpointing and publishing every new policy."""
    backend = join(cfg)
    t = build(cfg)
    model, optim, objective, model_dir = t.model, t.optim, t.objective, t.model_dir
    run = Path(cfg.output_dir)
    publisher = make_publisher(cfg) if dist.get_rank() == 0 else None
    sync = outer_sync.build(cfg, t)  # what wraps the loop between trainers elsewhere: nothing by default
    saved = objective.modules() | sync.state()  # checkpointed beside the model and optimizer
    # The run id each checkpoint and weight step names (utils/run_dir.py): rl's, else the resumed checkpoint's
    start, path, run_id = resume_point(cfg)
    if path is not None:
        checkpoint.load(path, model, optim, saved)
        log.info(f"resumed from {path} (step {start})")
        publish(cfg, model, model_dir, start, publisher, start, run_id)
    checkpointed = start
    sink, receiver = None, None
    if dist.get_rank() == 0:  # rows of steps the checkpoint does not contain are forgotten
        sink = MetricsLog(run, "trainer", start, cfg.wandb.model_dump(), cfg.model_dump(mode="json"))
        keys = auth.curve_keys(cfg.auth.keys_dir, "trainer", "orchestrator") if cfg.auth.keys_dir else None
        receiver = BatchReceiver(cfg.transport.address, keys)
    log.info(f"ready: {sum(p.numel() for p in model.parameters()):,} params/rank, world {dist.get_world_size()} ({backend}), "
             f"steps {start}..{cfg.max_steps} of run {run_id}")

    handoff = {"ckpt_s": 0.0, "publish_s": 0.0}  # saving and publishing the weights this step starts from

    def after(step: int, metrics: dict[str, float]) -> None:
        nonlocal checkpointed
        # Order matters for exact resume: metrics line, then checkpoint, then publish. A crash in
        # between makes the resumed run redo this step (its line is dropped), never skip it.
        metrics |= sync.metrics()
        if dist.get_rank() == 0:
            sink.log({"step": step, **handoff, "time": time.time(), **metrics, "transport/refused": receiver.stats["refused"]})
        t0 = time.time()
        if (step + 1) % cfg.ckpt.interval == 0 or step + 1 == cfg.max_steps:
            checkpoint.save(run / "checkpoints", step + 1, model, optim, cfg.ckpt.keep_last, saved, run_id)
            checkpointed = step + 1
        handoff["ckpt_s"] = time.time() - t0
        t0 = time.time()
        publish(cfg, model, model_dir, step + 1, publisher, checkpointed, run_id)
        handoff["publish_s"] = time.time() - t0  # writing weights/step_N and inference loading it (filesystem)
        losses = " ".join(f"{k} {v:+.4f}" for k, v in metrics.items() if k.startswith("loss/")) or "empty batch: skipped"
        log.info(f"step {step} {losses} grad_norm {metrics['grad_norm']:.3f} "
                 f"tokens {int(metrics['trained_tokens'])} compute {metrics['compute_s']:.2f}s -> weights v{step + 1}")

    try:
        with sync:
            fit(t, ZmqSource(receiver), start, after)
    finally:  # stopped too (a signal's SystemExit): closed here, not whenever garbage collection gets to them
        if receiver is not None:
            receiver.close()
            sink.close()
        if publisher is not None:
            publisher.close()
    log.info("done")
    dist.destroy_process_group()

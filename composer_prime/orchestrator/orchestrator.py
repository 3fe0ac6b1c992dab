"""The orchestrator: sample tasks, collect groups of rollouts, compute advantages, send batches.

Async with bounded staleness: the batch for trainer step n may come from policy n-k at the
oldest (k = max_async_level). With k = 1 inference samples batch n while the trainer is busy
with step n-1. A rollout from an older policy is dropped and counted, never trained on.
Task choice is a pure function of (seed, step), so a resumed run continues exactly.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

from transformers import AutoTokenizer

from composer_prime.config import OrchestratorConfig, load_or_exit
from composer_prime.model.resolve import resolve_model
from composer_prime.orchestrator.advantages import group_advantages, has_spread, shape_reward
from composer_prime.orchestrator.client import InferenceClient
from composer_prime.orchestrator.envs import load_tasks
from composer_prime.orchestrator.rollouts import group
from composer_prime.trainer import checkpoint
from composer_prime.transports.batches.schema import Batch
from composer_prime.transports.batches.zmq import BatchSender


def log(msg: str) -> None:
    print(f"[orchestrator] {msg}", flush=True)


class Orchestrator:
    def __init__(self, cfg: OrchestratorConfig) -> None:
        self.cfg = cfg
        self.run = Path(cfg.output_dir)
        self.tok = AutoTokenizer.from_pretrained(resolve_model(cfg.model, log))
        self.train_tasks = load_tasks(cfg.env.id, cfg.env.args)
        self.eval_tasks = load_tasks(cfg.env.id, cfg.env.eval_args)[: cfg.eval.num_tasks]
        self.client = InferenceClient(cfg.inference_urls, cfg.model)
        self.sem = asyncio.Semaphore(cfg.max_concurrency)
        self.metrics_path = self.run / "orchestrator" / "metrics.jsonl"

    async def evaluate(self) -> tuple[float, int]:
        """Mean reward on the fixed held-out tasks, fixed seeds: comparable across steps."""
        version = min(await self.client.versions())
        groups = await asyncio.gather(*(group(self.client, self.tok, t, self.cfg.sampling, 2, 10_000_000 + i, self.sem)
                                        for i, t in enumerate(self.eval_tasks)))
        rewards = [r.reward for g in groups for r in g]
        return sum(rewards) / len(rewards), version

    async def collect(self, step: int) -> tuple[Batch, dict]:
        cfg = self.cfg
        rng = random.Random(f"{cfg.seed}-{step}")
        n_groups = cfg.batch_size // cfg.group_size
        kept: list = []
        stats = {"stale": 0, "flat_groups": 0, "groups": 0, "rewards": []}
        start, tokens = time.time(), 0
        for _attempt in range(8):  # dynamic sampling: refill until the batch is full
            need = n_groups - len(kept)
            if need <= 0:
                break
            draws = [(rng.randrange(len(self.train_tasks)), rng.randrange(2**31)) for _ in range(need)]
            groups = await asyncio.gather(*(group(self.client, self.tok, self.train_tasks[i], cfg.sampling,
                                                  cfg.group_size, seed, self.sem) for i, seed in draws))
            for g in groups:
                stats["groups"] += 1
                stats["rewards"].extend(r.reward for r in g)
                rewards = [self.shaped(r) for r in g]
                tokens += sum(len(r.completion.token_ids) for r in g)
                if min(r.completion.weight_version for r in g) < step - cfg.max_async_level:
                    stats["stale"] += len(g)
                elif cfg.dynamic_sampling and not has_spread(rewards):
                    stats["flat_groups"] += 1
                else:
                    kept.append(g)
        gen_s = time.time() - start
        samples, advantages = [], []
        for g in kept[:n_groups]:
            for r, a in zip(g, group_advantages([self.shaped(r) for r in g], cfg.advantage)):
                samples.append(r.to_sample(a, cfg.sampling.temperature, cfg.seq_len))
                advantages.append(a)
        rewards = stats.pop("rewards")
        info = {
            "reward": sum(rewards) / max(1, len(rewards)),
            "adv_abs_mean": sum(map(abs, advantages)) / max(1, len(advantages)),
            "adv_std": statistics.pstdev(advantages) if advantages else 0.0,
            "gen_s": gen_s,
            "gen_tokens_per_s": tokens / max(gen_s, 1e-9),
            "rollouts": len(rewards),
            "policy_versions": sorted({s.policy_version for s in samples}),
            **stats,
        }
        return Batch(step=step, samples=samples, metrics={"reward": info["reward"]}), info

    def shaped(self, r) -> float:
        c = self.cfg
        return shape_reward(r.reward, len(r.completion.token_ids), c.overlong_max, c.overlong_cache, c.length_penalty,
                            c.sampling.max_tokens)

    def record(self, row: dict) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    async def run_loop(self) -> None:
        cfg = self.cfg
        start = 0
        if cfg.resume and (found := checkpoint.latest(self.run / "checkpoints")):
            start = found[0]
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        if self.metrics_path.exists():  # keep what happened before the checkpoint we resume from
            rows = [ln for ln in self.metrics_path.read_text().splitlines() if start and json.loads(ln)["step"] < start]
            self.metrics_path.write_text("".join(r + "\n" for r in rows))
        log(f"waiting for inference at {cfg.inference_urls}")
        await self.client.wait_ready()
        sender = BatchSender(cfg.transport.address)
        log(f"{len(self.train_tasks)} train / {len(self.eval_tasks)} held-out tasks from '{cfg.env.id}'; steps {start}..{cfg.max_steps}")
        run_start = time.time()
        for step in range(start, cfg.max_steps):
            version = await self.client.wait_version(step - cfg.max_async_level)
            row: dict = {"step": step, "time": time.time()}
            if step == start or step % cfg.eval.interval == 0:
                t_eval = time.time()
                row["eval_reward"], row["eval_version"] = await self.evaluate()
                row["eval_s"] = time.time() - t_eval
            batch, info = await self.collect(step)
            if not batch.samples:
                log(f"step {step}: every group was flat or stale; sending an empty batch")
            sender.send(batch)
            row |= info
            self.record(row)
            held = f" held-out {row['eval_reward']:.3f} (v{row['eval_version']})" if "eval_reward" in row else ""
            log(f"step {step + 1}/{cfg.max_steps} reward {info['reward']:.3f}{held} | {info['gen_tokens_per_s']:.0f} tok/s "
                f"| policy v{version} | stale {info['stale']} flat {info['flat_groups']} | {time.time() - run_start:.0f}s")
        final = await self.client.wait_version(cfg.max_steps)
        t_eval = time.time()
        reward, version = await self.evaluate()
        self.record({"step": cfg.max_steps, "time": time.time(), "eval_reward": reward, "eval_version": version,
                     "eval_s": time.time() - t_eval})
        log(f"final held-out reward {reward:.3f} at weights v{final}")
        sender.close()
        await self.client.close()


def main(argv: list[str] | None = None) -> None:
    cfg, dry_run = load_or_exit(OrchestratorConfig, argv if argv is not None else sys.argv[1:])
    if dry_run:  # the config resolved; nothing to start
        return
    asyncio.run(Orchestrator(cfg).run_loop())


if __name__ == "__main__":
    main()

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
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer

from composer_prime.utils.proc import pin_cpus
from composer_prime.config import OrchestratorConfig, load_or_exit
from composer_prime.config.models import EnvConfig
from composer_prime.model.resolve import resolve_model
from composer_prime.orchestrator.advantages import group_advantages, has_spread, shape_reward
from composer_prime.orchestrator.client import InferenceClient
from composer_prime.orchestrator.distill import Distiller, DistillStats
from composer_prime.orchestrator.envs import load_tasks
from composer_prime.orchestrator.rollouts import Rollout, group
from composer_prime.trainer import checkpoint
from composer_prime.transports.batches.schema import Batch
from composer_prime.transports.batches.zmq import BatchSender


def log(msg: str) -> None:
    print(f"[orchestrator] {msg}", flush=True)


@dataclass
class EnvRun:
    """One environment of the mix: its tasks and its share of every batch."""

    cfg: EnvConfig
    train: list
    held_out: list
    group_size: int
    groups: int  # groups of this environment in each batch
    weight: float  # its share of the held-out mean


def mean(xs: list[float]) -> float:
    return sum(xs) / max(1, len(xs))


def env_metrics(prefix: str, rollouts: list[Rollout]) -> dict[str, float]:
    keys = sorted({k for r in rollouts for k in r.metrics})
    out = {f"{prefix}/reward": mean([r.reward for r in rollouts]),
           **{f"{prefix}/{k}": mean([r.metrics[k] for r in rollouts if k in r.metrics]) for k in keys}}
    if "tool_calls" in keys:  # failed calls over all calls, pooled (a per-rollout mean would overweight short episodes)
        calls = sum(r.metrics.get("tool_calls", 0) for r in rollouts)
        out[f"{prefix}/tool_error_rate"] = sum(r.metrics.get("tool_errors", 0) for r in rollouts) / max(1.0, calls)
    return out


class Orchestrator:
    def __init__(self, cfg: OrchestratorConfig) -> None:
        self.cfg = cfg
        self.run = Path(cfg.output_dir)
        self.tok = AutoTokenizer.from_pretrained(resolve_model(cfg.model, log))
        groups, total = cfg.groups_per_step(), sum(e.ratio for e in cfg.envs)
        self.envs = [EnvRun(e, load_tasks(e.id, e.args), load_tasks(e.id, e.eval_args)[: cfg.eval.num_tasks],
                            e.group_size or cfg.group_size, groups[e.id], e.ratio / total) for e in cfg.envs]
        self.client = InferenceClient(cfg.inference_urls, cfg.model)
        self.sem = asyncio.Semaphore(cfg.max_concurrency)
        self.distiller = Distiller(cfg.distill, self.tok, self.client) if cfg.distill.enabled else None
        self.metrics_path = self.run / "orchestrator" / "metrics.jsonl"

    def _group(self, env: EnvRun, task, size: int, seed: int):
        return group(self.client, self.tok, env.cfg.id, task, self.cfg.sampling, self.cfg.seq_len, env.cfg.max_turns,
                     size, seed, self.sem)

    async def evaluate(self) -> tuple[dict, int]:
        """Held-out reward per environment on fixed tasks and seeds (comparable across steps);
        `eval_reward` is their mean weighted by the mix ratios."""
        version = min(await self.client.versions())
        per_env = await asyncio.gather(*(asyncio.gather(*(self._group(env, t, 2, 10_000_000 + i)
                                                          for i, t in enumerate(env.held_out))) for env in self.envs))
        row: dict = {}
        for env, groups in zip(self.envs, per_env):  # every environment's held-out set in one concurrent pass
            row |= env_metrics(f"eval/{env.cfg.id}", [r for g in groups for r in g])
        row["eval_reward"] = sum(env.weight * row[f"eval/{env.cfg.id}/reward"] for env in self.envs)
        return row, version

    async def collect(self, step: int) -> tuple[Batch, dict]:
        cfg = self.cfg
        rng = random.Random(f"{cfg.seed}-{step}")
        kept: dict[str, list] = {env.cfg.id: [] for env in self.envs}
        seen: dict[str, list[Rollout]] = {env.cfg.id: [] for env in self.envs}
        stats = {"stale": 0, "flat_groups": 0, "groups": 0}
        flat: list[Rollout] = []  # rollouts of flat groups: no rl signal, but their error turns can be distilled
        start, tokens = time.time(), 0
        for _attempt in range(8):  # dynamic sampling: refill until every environment's share is full
            draws = [(env, env.train[rng.randrange(len(env.train))], rng.randrange(2**31))
                     for env in self.envs for _ in range(env.groups - len(kept[env.cfg.id]))]
            if not draws:
                break
            groups = await asyncio.gather(*(self._group(env, task, env.group_size, seed) for env, task, seed in draws))
            for (env, _, _), g in zip(draws, groups):
                stats["groups"] += 1
                seen[env.cfg.id] += g
                tokens += sum(r.model_tokens for r in g)
                shaped = [self.shaped(r) for r in g]  # once per group: spread check and advantages
                if min(r.weight_version for r in g) < step - cfg.max_async_level:
                    stats["stale"] += len(g)
                elif cfg.dynamic_sampling and not has_spread(shaped):
                    stats["flat_groups"] += 1
                    flat += g
                else:
                    kept[env.cfg.id].append((g, shaped))
        batch_groups = [(g, shaped) for env in self.envs for g, shaped in kept[env.cfg.id][: env.groups]]
        # at most one batch's worth: refill rounds can leave many flat groups, and the trainer's step time follows
        distill_only = [r for r in flat if r.sites][: cfg.batch_size] if cfg.distill.flat_groups else []
        dstats = DistillStats()
        if self.distiller is not None:
            await asyncio.gather(*(self.distiller.attach(r, dstats) for g, _ in batch_groups for r in g),
                                 *(self.distiller.attach(r, dstats) for r in distill_only))
        gen_s = time.time() - start
        samples, advantages = [], []
        for g, shaped in batch_groups:
            for r, a in zip(g, group_advantages(shaped, cfg.advantage)):
                samples.append(r.to_sample(a, cfg.sampling.temperature, cfg.seq_len))
                advantages.append(a)
        extra = [r.to_sample(0.0, cfg.sampling.temperature, cfg.seq_len, rl=False) for r in distill_only if r.teachers]
        samples += [s for s in extra if s.channel_data.get("distill")]  # only those whose error turn survived the length cut
        rollouts = [r for rs in seen.values() for r in rs]
        info = {
            "reward": mean([r.reward for r in rollouts]),
            "adv_abs_mean": mean([abs(a) for a in advantages]),
            "adv_std": statistics.pstdev(advantages) if advantages else 0.0,
            "gen_s": gen_s,
            "gen_tokens_per_s": tokens / max(gen_s, 1e-9),
            "rollouts": len(rollouts),
            "policy_versions": sorted({s.policy_version for s in samples}),
            **stats,
        }
        if self.distiller is not None:
            info |= {"distill/sites": dstats.sites, "distill/hinted": dstats.hinted, "distill/no_hint": dstats.no_hint,
                     "distill/template_misses": dstats.template, "distill/unscored": dstats.unscored,
                     "distill/distill_only_samples": len(samples) - len(advantages),
                     "distill/hinted_frac": sum(bool(r.teachers) for r in rollouts) / max(1, len(rollouts)),
                     "distill/tokens": sum(t["length"] for s in samples for t in s.channel_data.get("distill", []))}
        for env in self.envs:
            info |= env_metrics(f"env/{env.cfg.id}", seen[env.cfg.id])
        return Batch(step=step, samples=samples), info

    def shaped(self, r) -> float:
        c = self.cfg
        return shape_reward(r.reward, r.model_tokens, c.overlong_max, c.overlong_cache, c.length_penalty,
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
        for env in self.envs:
            log(f"{env.cfg.id}: {len(env.train)} train / {len(env.held_out)} held-out tasks, "
                f"{env.groups} groups of {env.group_size} per step")
        log(f"steps {start}..{cfg.max_steps}")
        run_start = time.time()
        for step in range(start, cfg.max_steps):
            t_wait = time.time()
            version = await self.client.wait_version(step - cfg.max_async_level)
            row: dict = {"step": step, "time": time.time()}
            row["wait_s"] = row["time"] - t_wait  # idle: waiting for a recent enough policy
            if step == start or step % cfg.eval.interval == 0:
                t_eval = time.time()
                evals, row["eval_version"] = await self.evaluate()
                row |= evals | {"eval_s": time.time() - t_eval}
            t_collect = time.time()
            batch, info = await self.collect(step)
            row["collect_s"] = time.time() - t_collect  # generation and scoring (gen_s), then advantages and samples
            if not batch.samples:
                log(f"step {step}: every group was flat or stale; sending an empty batch")
            t_send = time.time()
            sender.send(batch)
            row |= info | {"send_s": time.time() - t_send}
            self.record(row)
            held = f" held-out {row['eval_reward']:.3f} (v{row['eval_version']})" if "eval_reward" in row else ""
            log(f"step {step + 1}/{cfg.max_steps} reward {info['reward']:.3f}{held} | {info['gen_tokens_per_s']:.0f} tok/s "
                f"| policy v{version} | stale {info['stale']} flat {info['flat_groups']} | {time.time() - run_start:.0f}s")
        final = await self.client.wait_version(cfg.max_steps)
        t_eval = time.time()
        evals, version = await self.evaluate()
        self.record({"step": cfg.max_steps, "time": time.time(), **evals, "eval_version": version,
                     "eval_s": time.time() - t_eval})
        log(f"final held-out reward {evals['eval_reward']:.3f} at weights v{final}")
        sender.close()
        if self.distiller is not None:
            await self.distiller.close()
        await self.client.close()


def main(argv: list[str] | None = None) -> None:
    cfg, dry_run = load_or_exit(OrchestratorConfig, argv if argv is not None else sys.argv[1:])
    if dry_run:  # the config resolved; nothing to start
        return
    pin_cpus(cfg.cpus, "orchestrator")
    asyncio.run(Orchestrator(cfg).run_loop())


if __name__ == "__main__":
    main()

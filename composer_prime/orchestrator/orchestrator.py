"""The orchestrator: sample tasks, collect groups of rollouts, compute advantages, send batches.

Async with bounded staleness: the batch for trainer step n may come from policy n-k at the
oldest (k = max_async_level). With k = 1 inference samples batch n while the trainer is busy
with step n-1. A rollout from an older policy is dropped and counted, never trained on.
Task choice is a pure function of (seed, step), so a resumed run continues exactly; of DiLoCo
islands, each draws from its own share of the train tasks (seed, step and island). Where to
continue is the trainer's word: it announces the step it expects over the batch channel (on
start, and again after every restart), so the orchestrator needs none of the trainer's files.

Each step is two stages: `collect` samples groups and passes each through the rollout filters
(orchestrator/filters/: staleness, dynamic sampling, ...; a refused flat group is refilled), and
`build` turns the kept ones into `rl` samples, then runs the active batch steps
(orchestrator/batch.py: one per channel that needs orchestrator-side work, e.g. distill's hints
and teacher views).

Environments of every kind look alike here (env_runtime/envs.py): tasks, a start and a close.
A rollout its environment failed (a server that died, refused or stalled) is dropped, counted by
reason (`dropped/<reason>`), and the step goes on with the others.
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from transformers import AutoTokenizer

from composer_prime.config import OrchestratorConfig
from composer_prime.config.envs import EnvConfig
from composer_prime.contract.batches import Batch
from composer_prime.env_runtime.envs import Env, load_env
from composer_prime.env_runtime.episode import FAULTS
from composer_prime.model.resolve import resolve_model
from composer_prime.orchestrator.advantages import group_advantages, shape_reward
from composer_prime.orchestrator.batch import BatchContext, make_steps
from composer_prime.orchestrator.client import InferenceClient
from composer_prime.orchestrator.filters import make_filters, metric_names
from composer_prime.orchestrator.pool import make_sources
from composer_prime.orchestrator.prompt_fit import check_seq_len
from composer_prime.orchestrator.rollouts import Rollout, dropped_note, group, stop_if_every_call_timed_out
from composer_prime.orchestrator.traces import TraceLog
from composer_prime.transports.batches.zmq import BatchSender, CurveKeys
from composer_prime.utils import watchdog
from composer_prime.utils.metrics import MetricsLog
from composer_prime.utils.progress import StillWaiting
from composer_prime.utils.proc import long_lived
from composer_prime.utils.report import volunteers_line
from composer_prime.utils.run_dir import save_orchestrator

log = logging.getLogger(__name__)




@dataclass
class EnvRun:
    """One environment of the mix: its tasks and its share of every batch."""

    cfg: EnvConfig
    env: Env  # its tasks, start, close and counters
    train: list
    held_out: list
    group_size: int
    groups: int  # groups of this environment in each batch
    weight: float  # its share of the held-out mean


@dataclass
class Collected:
    """One step's sampling: the kept groups (with shaped rewards) and everything else it saw."""

    groups: list[tuple[list[Rollout], list[float]]] = field(default_factory=list)  # in batch order
    flat: list[Rollout] = field(default_factory=list)  # rollouts of groups a keep_aside filter dropped (flat rewards)
    seen: dict[str, list[Rollout]] = field(default_factory=dict)  # per environment: kept, flat and stale
    stats: dict[str, int] = field(default_factory=lambda: {"groups": 0, **dict.fromkeys(metric_names(), 0)})  # filters' drops
    dropped: dict[str, list[Rollout]] = field(default_factory=dict)  # per environment: rollouts its environment failed
    tokens: int = 0  # model tokens sampled
    start: float = field(default_factory=time.time)


def mean(xs: list[float]) -> float:
    return sum(xs) / max(1, len(xs))


def dropped_metrics(dropped: list[Rollout]) -> dict[str, int]:
    """`dropped` and `dropped/<reason>` for every reason (0 when absent: a sum over steps is a count)."""
    return {"dropped": len(dropped), **{f"dropped/{k}": sum(r.dropped == k for r in dropped) for k in FAULTS}}


def keep(rollouts: list[Rollout], dropped: list[Rollout]) -> list[Rollout]:
    """The rollouts their environment finished; the others are appended to `dropped`."""
    dropped += [r for r in rollouts if r.dropped]
    return [r for r in rollouts if not r.dropped]


def env_metrics(prefix: str, rollouts: list[Rollout]) -> dict[str, float]:
    keys = sorted({k for r in rollouts for k in r.metrics})
    out = {f"{prefix}/reward": mean([r.reward for r in rollouts]),
           **{f"{prefix}/{k}": mean([r.metrics[k] for r in rollouts if k in r.metrics]) for k in keys}}
    if "tool_calls" in keys:  # failed calls over all calls, pooled (a per-rollout mean would overweight short episodes)
        calls = sum(r.metrics.get("tool_calls", 0) for r in rollouts)
        out[f"{prefix}/tool_error_rate"] = sum(r.metrics.get("tool_errors", 0) for r in rollouts) / max(1.0, calls)
    return out


FLAT_STEPS = 3  # steps in a row with every group of an environment flat before the run says so


def island_share(train: list, island: int, islands: int, env_id: str) -> list:
    """An island's train tasks: every `islands`-th from index `island` on, so islands never draw the
    same task; the held-out set stays whole, so every island is evaluated alike."""
    share = train[island::islands]
    if not share:
        raise SystemExit(f"env '{env_id}': {len(train)} train tasks cannot be shared by {islands} islands")
    return share


class Orchestrator:
    def __init__(self, cfg: OrchestratorConfig, keys: CurveKeys = None) -> None:
        self.cfg, self.keys = cfg, keys
        self.run = Path(cfg.output_dir)
        self.tok = AutoTokenizer.from_pretrained(resolve_model(cfg.model))
        groups, total = cfg.groups_per_step(), sum(e.ratio for e in cfg.envs)
        loaded = [load_env(e, cfg.eval.num_tasks, self.run / "logs") for e in cfg.envs]
        self.envs = [EnvRun(e, env, island_share(env.train, cfg.island, cfg.islands, e.id), env.held_out,
                            e.group_size or cfg.group_size, groups[e.id], e.ratio / total) for e, env in zip(cfg.envs, loaded)]
        check_seq_len([(e.cfg.id, e.train) for e in self.envs], self.tok, cfg.seq_len, "seq_len")  # else empty batches to the end
        self.client = InferenceClient(cfg.inference_urls, cfg.model, cfg.inference_timeout_s)
        # nodes that join while the run goes (volunteers, when the run takes them): sources registered by name
        self.sources = make_sources(cfg, self.client.pool, self.client.audit, lambda: self.client.served)
        self.sem = asyncio.Semaphore(cfg.max_concurrency)
        self.steps = make_steps(cfg, self.tok, self.client)
        self.filters = make_filters(cfg)
        self.filter_metrics = metric_names()  # once: it reads every package's entry points (13 ms a step, profiled)
        self.trainer: str | None = None  # the trainer start we follow (the id it announces)
        self.restart: int | None = None  # the step a newly started trainer expects, until we act on it
        self.restarts = 0  # trainer restarts followed (a metric)
        self.flat_steps = {env.cfg.id: 0 for env in self.envs}  # steps in a row an environment put no group in the batch
        self.traces = TraceLog(self.run / "orchestrator" / "traces.jsonl") if cfg.record_traces else None
        self.boxed = {env.cfg.id for env in self.envs if env.env.box is not None}  # scored under a call timeout

    def _group(self, env: EnvRun, task, size: int, seed: int):
        return group(self.client, self.tok, env.cfg.id, task, self.cfg.sampling, self.cfg.seq_len, env.cfg.max_turns,
                     size, seed, self.sem, env.env.box)

    def warn_if_flat(self, info: dict, steps: int = FLAT_STEPS) -> None:
        """Once per stretch: an environment whose every group was flat for `steps` steps in a row (all of a
        group's rollouts scored alike, through every draw) gives the policy nothing to learn from it."""
        for env in self.envs:
            n = self.flat_steps[env.cfg.id] = 0 if info[f"env/{env.cfg.id}/groups_in_batch"] else self.flat_steps[env.cfg.id] + 1
            if n == steps:
                log.warning(f"{env.cfg.id}: no group with different rewards in {steps} steps (its reward "
                            f"{info[f'env/{env.cfg.id}/reward']:.2f}, every rollout alike): nothing to learn from it. A model "
                            "that never succeeds there needs a warm start first (docs/environments.md)")

    async def evaluate(self) -> tuple[dict, int]:
        """Held-out reward per environment on fixed tasks and seeds (comparable across steps);
        `eval_reward` is their mean weighted by the mix ratios."""
        version = min(await self.client.versions())
        per_env = await asyncio.gather(*(asyncio.gather(*(self._group(env, t, 2, 10_000_000 + i)
                                                          for i, t in enumerate(env.held_out))) for env in self.envs))
        stop_if_every_call_timed_out("the held-out evaluation", [r for gs in per_env for g in gs for r in g], self.boxed)
        row: dict = {}
        for env, groups in zip(self.envs, per_env):  # every environment's held-out set in one concurrent pass
            dropped: list[Rollout] = []
            finished = keep([r for g in groups for r in g], dropped)
            # a volunteer's completion its validator rejected counts in no measure, held-out ones included
            verified = [r for r in finished if not r.unverified]
            row |= env_metrics(f"eval/{env.cfg.id}", verified)
            row[f"eval/{env.cfg.id}/dropped"] = len(dropped)
            row[f"eval/{env.cfg.id}/unverified"] = len(finished) - len(verified)
        row["eval_reward"] = sum(env.weight * row[f"eval/{env.cfg.id}/reward"] for env in self.envs)
        return row, version

    async def collect(self, step: int) -> Collected:
        """Sample this step's groups: drop stale ones, refill flat ones (dynamic sampling)."""
        cfg = self.cfg
        rng = random.Random(f"{cfg.seed}-{step}" + (f"-{cfg.island}" if cfg.islands > 1 else ""))  # each island its own draws
        kept: dict[str, list] = {env.cfg.id: [] for env in self.envs}
        c = Collected(seen={env.cfg.id: [] for env in self.envs}, dropped={env.cfg.id: [] for env in self.envs},
                      stats={"groups": 0, **dict.fromkeys(self.filter_metrics, 0)})
        for _attempt in range(8):  # dynamic sampling: refill until every environment's share is full
            draws = [(env, env.train[rng.randrange(len(env.train))], rng.randrange(2**31))
                     for env in self.envs for _ in range(env.groups - len(kept[env.cfg.id]))]
            if not draws:
                break
            groups = await asyncio.gather(*(self._group(env, task, env.group_size, seed) for env, task, seed in draws))
            stop_if_every_call_timed_out(f"step {step}", [r for g in groups for r in g], self.boxed)
            for (env, _, _), g in zip(draws, groups):
                c.stats["groups"] += 1
                c.tokens += sum(r.model_tokens for r in g)
                if not (g := keep(g, c.dropped[env.cfg.id])):
                    continue
                c.seen[env.cfg.id] += g
                shaped = [self.shaped(r) for r in g]  # once per group: the filters and advantages
                refused = next((f for f in self.filters if not f.keeps(step, g, shaped)), None)
                if refused is None:
                    kept[env.cfg.id].append((g, shaped))
                    continue
                c.stats[refused.name] = c.stats.get(refused.name, 0) + refused.count(g)
                if refused.keep_aside:
                    c.flat += g
        c.groups = [(g, shaped) for env in self.envs for g, shaped in kept[env.cfg.id][: env.groups]]
        for env in self.envs:  # its share of the batch, or fewer where its groups stayed flat through every draw
            c.stats[f"env/{env.cfg.id}/groups_in_batch"] = len(kept[env.cfg.id][: env.groups])
        return c

    async def build(self, step: int, c: Collected) -> tuple[Batch, dict]:
        """The kept groups' rl samples, then each active step's additions; the metrics of both."""
        cfg = self.cfg
        batch = BatchContext(step, flat=c.flat, seen=[r for rs in c.seen.values() for r in rs])
        advantages = []
        for g, shaped in c.groups:
            for r, a in zip(g, group_advantages(shaped, cfg.advantage)):
                batch.add(r.to_sample(a, cfg.sampling.temperature, cfg.seq_len), r)
                advantages.append(a)
        truncated = sum(not any(s.channel_weights["rl"]) for s in batch.samples)  # cut to no model token
        step_metrics: dict = {}
        for name, run_step in self.steps.items():
            step_metrics |= {f"{name}/{k}": v for k, v in (await run_step(batch)).items()}
        if self.traces is not None:
            self.traces.write(step, batch.seen)
        gen_s = time.time() - c.start
        info = {
            "reward": mean([r.reward for r in batch.seen]),
            "adv_abs_mean": mean([abs(a) for a in advantages]),
            "adv_std": statistics.pstdev(advantages) if advantages else 0.0,
            "gen_s": gen_s,
            "gen_tokens_per_s": c.tokens / max(gen_s, 1e-9),
            "rollouts": len(batch.seen),
            "policy_versions": sorted({s.policy_version for s in batch.samples}),
            **c.stats,
            "truncated": truncated,
            # a batch with nothing to train on is a normal event; stale, flat_groups and truncated say why
            "empty_batch": int(not any(any(w) for s in batch.samples for w in s.channel_weights.values())),
            **step_metrics,
        }
        info |= dropped_metrics([r for rs in c.dropped.values() for r in rs])
        for source in self.sources:  # what each joined node has in this batch (a rejected one: nothing)
            info |= source.in_batch([r.nodes for g, _ in c.groups for r in g])
        for env in self.envs:
            info |= env_metrics(f"env/{env.cfg.id}", c.seen[env.cfg.id])
            info[f"env/{env.cfg.id}/dropped"] = len(c.dropped.get(env.cfg.id, []))
            info |= {f"env/{env.cfg.id}/{k}": v for k, v in env.env.stats().items()}
            if dropped := c.dropped.get(env.cfg.id):
                log.warning(f"step {step}: {env.cfg.id}: {len(dropped)} rollout(s) dropped, e.g. "
                            f"{dropped[0].dropped}: {dropped[0].dropped_detail}")
        return Batch(step=step, samples=batch.samples), info

    def shaped(self, r) -> float:
        c = self.cfg
        return shape_reward(r.reward, r.model_tokens, c.overlong_max, c.overlong_cache, c.length_penalty,
                            c.sampling.max_tokens)

    def restarted(self, sender: BatchSender) -> int | None:
        """The step a trainer started since we last acted expects (its latest word), else None."""
        for trainer, expect in sender.announcements():
            if trainer != self.trainer or self.restart is not None:
                self.trainer, self.restart = trainer, expect
        return self.restart

    async def run_loop(self) -> None:
        try:
            for env in self.envs:
                await env.env.start()
            for source in self.sources:
                await source.start()
            with long_lived():
                await self._loop()
        finally:  # also when inference is gone: the session closes before the process reports it
            for source in self.sources:
                await source.stop()
            await self.client.close()
            for env in self.envs:
                await env.env.close()

    async def wait_for_sources(self) -> None:
        """Until no node source waits for anything before the first step (volunteers' `wait_for`)."""
        if not (words := [w for s in self.sources if (w := s.waiting_for())]):
            return
        log.info(f"waiting for {'; '.join(words)} before the first step")
        with watchdog.waiting("the node sources", "; ".join(words)):
            waiting = StillWaiting("the first step's nodes")
            while words := [w for s in self.sources if (w := s.waiting_for())]:
                waiting.tick("; ".join(words))
                await asyncio.sleep(0.2)

    async def _loop(self) -> None:
        cfg = self.cfg
        log.info(f"waiting for inference at {cfg.inference_urls}")
        await self.client.wait_ready()
        sender = BatchSender(cfg.transport.address, self.keys)
        log.info(f"waiting for the trainer at {cfg.transport.address}")
        with watchdog.waiting("trainer", "its start"):
            waiting = StillWaiting(f"the trainer at {cfg.transport.address}")
            while self.restarted(sender) is None:
                waiting.tick()
                await asyncio.sleep(0.2)
        await self.wait_for_sources()
        watchdog.ready()  # inference answers and the trainer waits: the first batch is next
        step = start = self.restart
        self.restart = None
        metrics = MetricsLog(self.run, "orchestrator", start, cfg.wandb.model_dump(), cfg.model_dump(mode="json"))
        for env in self.envs:
            log.info(f"{env.cfg.id}: {len(env.train)} train / {len(env.held_out)} held-out tasks, "
                f"{env.groups} groups of {env.group_size} per step")
        log.info(f"steps {start}..{cfg.max_steps}")
        run_start = time.time()
        while True:
            # Step n may use policy n - k; after the last step, wait for the final weights.
            needed = step - cfg.max_async_level if step < cfg.max_steps else cfg.max_steps
            t_wait = time.time()
            with watchdog.waiting("trainer", f"weights v{needed}"):
                version = await self.client.wait_version(needed, interrupt=lambda: self.restarted(sender) is not None)
            row: dict = {"step": step, "time": time.time()}
            row["wait_s"] = row["time"] - t_wait  # idle: waiting for a recent enough policy
            if version is not None and step < cfg.max_steps:
                if step == start or step % cfg.eval.interval == 0:
                    t_eval = time.time()
                    evals, row["eval_version"] = await self.evaluate()
                    row |= evals | {"eval_s": time.time() - t_eval}
                t_collect = time.time()
                collected = await self.collect(step)
                row["collect_s"] = time.time() - t_collect  # generation, scoring, dynamic sampling
                t_build = time.time()
                batch, info = await self.build(step, collected)
                row["build_s"] = time.time() - t_build  # advantages, samples, batch steps
            if self.restarted(sender) is not None:  # what we made went to a trainer that is gone: follow the new one
                log.info(f"the trainer restarted and expects step {self.restart}: continuing from there")
                step = start = self.restart
                self.restart, self.restarts = None, self.restarts + 1
                metrics.rewind(step)
                continue
            if step == cfg.max_steps:
                break
            self.warn_if_flat(info)
            if info["empty_batch"]:
                log.info(f"step {step}: nothing to train on ({info['stale']} stale rollouts, {info['flat_groups']} flat "
                    f"groups, {info['truncated']} samples cut to no model token); sending it anyway")
            t_send = time.time()
            save_orchestrator(self.run, cfg.run_id, step + 1)  # before the send: never behind a trainer checkpoint
            sender.send(batch)
            row |= info | {"send_s": time.time() - t_send, "trainer_restarts": self.restarts}
            for source in self.sources:
                row |= source.metrics()
            metrics.log(row)
            held = f" held-out {row['eval_reward']:.3f} (v{row['eval_version']})" if "eval_reward" in row else ""
            held += f" | {volunteers_line(row)}" if "volunteers/healthy" in row else ""
            log.info(f"step {step + 1}/{cfg.max_steps} reward {info['reward']:.3f}{held} | {info['gen_tokens_per_s']:.0f} tok/s "
                f"| policy v{version} | stale {info['stale']} flat {info['flat_groups']}{dropped_note(collected.dropped)} "
                f"| {time.time() - run_start:.0f}s")
            step += 1
        t_eval = time.time()
        evals, final = await self.evaluate()
        metrics.log({"step": cfg.max_steps, "time": time.time(), **evals, "eval_version": final, "eval_s": time.time() - t_eval})
        log.info(f"final held-out reward {evals['eval_reward']:.3f} at weights v{version}")
        sender.close()
        metrics.close()
        if self.traces is not None:
            self.traces.close()
        for run_step in self.steps.values():
            await run_step.close()

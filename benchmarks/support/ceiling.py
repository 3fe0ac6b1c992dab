"""One measurement of the orchestrator's ceiling (benchmarks/orchestrator_ceiling.py): the real
orchestrator's steps against the instant engine (support/instant.py) behind the real inference
server, each batch sent over ZMQ to a sink; then the same work split by component.

End to end, a step is what the orchestrator's loop does for a training step: ask the servers'
weight version, `collect` (task draws, episodes: prompt, one turn through the token route,
scoring; filters), `build` (advantages, samples, metrics), `BatchSender.send`. The clock stops
when the sink has acknowledged every batch.

The components are the same kinds of work done one kind at a time, over every rollout of a batch,
with the orchestrator's own functions, so each is timed alone and their sum can be set against
the end-to-end step:
  prompt      open the episode, render the chat template to token ids (rollouts.py)
  http        every turn through the token route: TokenTurns.sample, under the step's semaphore, less
              the reply's decode (client, loopback, the server's routes, the engine's nothing)
  decode      the reply's ids to text (TokenTurns.sample)
  scoring     the environment's rewards and metrics on the reply (env_runtime/tasksets.score)
  advantages  shaped rewards, the filters and group advantages
  packing     each rollout's `rl` sample (Rollout.to_sample) into a Batch
  send        msgpack of the batch and the ZMQ send (BatchSender.send)
`other` is the end-to-end step less their sum: what the components leave out (the weight-version
request, task draws, Rollout objects, the episode's bookkeeping, the step's metrics, asyncio).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path

COMPONENTS = ("prompt", "http", "decode", "scoring", "advantages", "packing", "send")


def orchestrator(url: str, address: str, batch: int, group: int, max_tokens: int, work: Path):
    from composer_prime.config import OrchestratorConfig
    from composer_prime.orchestrator.orchestrator import Orchestrator

    # the quickstart's orchestrator settings (configs/quickstart.toml): reverse-text, seq_len 128, 16 tokens
    return Orchestrator(OrchestratorConfig.model_validate({
        "model": "tiny", "output_dir": str(work / "orchestrator"), "inference_urls": [url], "batch_size": batch,
        "group_size": group, "seq_len": 128, "sampling": {"max_tokens": max_tokens, "temperature": 1.0},
        "transport": {"address": address},
        "max_async_level": 10**9}))  # weights never change here: every rollout is on-policy, none is dropped as stale


def acknowledged(sender, want: int, timeout_s: float = 60.0) -> None:
    """Wait until the sink has announced `want` batches received."""
    deadline = time.perf_counter() + timeout_s
    got = 0
    while got < want:
        for _, expect in sender.announcements():
            got = max(got, expect)
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the sink acknowledged {got} of {want} batches")
        sender._sock.poll(10)  # noqa: SLF001 - block until its next message instead of spinning


async def step(o, sender, n: int) -> int:
    """One training step of the orchestrator's loop (less evaluation and logging); rollouts sent."""
    await o.client.versions()
    c = await o.collect(n)
    batch, info = await o.build(n, c)
    sender.send(batch)
    return len(batch.samples)


async def components(o, sender, n: int) -> dict[str, float]:
    """Seconds per component for one batch's worth of rollouts (tasks and seeds drawn like collect's)."""
    from composer_prime.contract.batches import Batch
    from composer_prime.env_runtime.episode import open_episode
    from composer_prime.orchestrator.advantages import group_advantages
    from composer_prime.orchestrator.rollouts import Rollout, TokenTurns
    try:  # the rollout's own prompt function (a baseline from before it existed rendered every prompt)
        from composer_prime.utils.chat import prompt_ids as render
    except ImportError:
        from composer_prime.utils.chat import encode_chat as render

    cfg, env, tok = o.cfg, o.envs[0], o.tok
    rng = random.Random(f"components-{n}")
    draws = [(env.train[rng.randrange(len(env.train))], rng.randrange(2**31)) for _ in range(env.groups)]
    t, clock = dict.fromkeys(COMPONENTS, 0.0), time.perf_counter

    start = clock()
    groups = []
    for task, seed in draws:
        rollouts = []
        for i in range(env.group_size):
            opened = await open_episode(task)
            r = Rollout(env.cfg.id, task, render(tok, opened.opening), opening=list(opened.opening))
            rollouts.append((r, opened, seed * 1000 + i))
        groups.append(rollouts)
    t["prompt"] = clock() - start

    start = clock()
    turns = await asyncio.gather(*(asyncio.gather(*(TokenTurns(r, o.client, tok, cfg.sampling, cfg.seq_len, s, o.sem).sample(0)
                                                    for r, _, s in g)) for g in groups))
    t["http"] = clock() - start
    start = clock()
    for g in groups:
        for r, _, _ in g:
            tok.decode(r.completion_ids, skip_special_tokens=True)
    t["decode"] = clock() - start
    t["http"] -= t["decode"]  # TokenTurns.sample decoded each reply once, as just timed

    start = clock()
    for g, ts in zip(groups, turns):
        for (r, opened, _), turn in zip(g, ts):
            r.reward, r.metrics = await opened.score(turn.text)
    t["scoring"] = clock() - start

    start = clock()
    kept = []
    for g in groups:
        rs = [r for r, _, _ in g]
        shaped = [o.shaped(r) for r in rs]
        if all(f.keeps(n, rs, shaped) for f in o.filters):
            kept.append((rs, group_advantages(shaped, cfg.advantage)))
    t["advantages"] = clock() - start

    start = clock()
    batch = Batch(n, [r.to_sample(a, cfg.sampling.temperature, cfg.seq_len) for rs, adv in kept for r, a in zip(rs, adv)])
    t["packing"] = clock() - start

    start = clock()
    sender.send(batch)
    t["send"] = clock() - start
    return t


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used: what a loaded machine's other work does not inflate."""
    fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(url: str, address: str, server: int, batch: int, group: int, max_tokens: int, steps: int,
                  work: Path) -> dict:
    from composer_prime.transports.batches.zmq import BatchSender

    try:  # what the orchestrator's run_loop holds its steps in (a baseline from before it had none)
        from composer_prime.utils.proc import long_lived
    except ImportError:
        long_lived = contextlib.nullcontext

    o = orchestrator(url, address, batch, group, max_tokens, work)
    sender = BatchSender(address)
    await o.envs[0].env.start()
    await o.client.wait_ready()
    acknowledged(sender, 0)
    try:
        with long_lived():
            for n in range(2):  # warm-up, untimed: connections opened, first requests
                await step(o, sender, steps + n)
            acknowledged(sender, 2)
            requests = o.client.requests
            start, cpu = time.perf_counter(), (time.process_time(), cpu_s(server))
            rollouts = 0
            for n in range(steps):
                rollouts += await step(o, sender, n)
            acknowledged(sender, 2 + steps)
            seconds = time.perf_counter() - start
            cpu = (time.process_time() - cpu[0], cpu_s(server) - cpu[1])
            requests = o.client.requests - requests
            parts = [await components(o, sender, n) for n in range(steps)]
            acknowledged(sender, 2 + 2 * steps)
    finally:
        await o.envs[0].env.close()
        await o.client.close()
        sender.close()
    per = {k: sum(p[k] for p in parts) / rollouts for k in COMPONENTS}  # seconds per rollout
    per["other"] = seconds / rollouts - sum(per.values())
    return {"rollouts": rollouts, "seconds": seconds, "rollouts_per_s": rollouts / seconds,
            "requests_per_step": requests / steps, "us_per_rollout": {k: v * 1e6 for k, v in per.items()},
            "cpu_us_per_rollout": {"orchestrator": cpu[0] / rollouts * 1e6, "server": cpu[1] / rollouts * 1e6}}


if __name__ == "__main__":  # python ceiling.py URL ADDRESS SERVER_PID BATCH GROUP MAX_TOKENS STEPS WORK: its JSON on stdout
    url, address, *nums, work = sys.argv[1:]
    print(json.dumps(asyncio.run(measure(url, address, *map(int, nums), Path(work)))))

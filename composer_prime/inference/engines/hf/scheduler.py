"""The continuous batch: one loop that admits, decodes and retires, one step at a time.

Between two decode steps (a step boundary) the loop, in this order: runs queued jobs (scoring,
and a weight swap once no request is in flight: while one waits, nothing new is admitted, so
every completion is decoded by one set of weights, as the server's version stamp says); retires
the requests whose last step finished them (stop token or budget) and closes the holes they
leave by moving the last live rows into them; admits waiting requests into the free rows once the
oldest has waited a few milliseconds (their prompts prefilled together, one prefill per distinct
prompt) and decodes one step for every live row. A request's tokens depend only on its prompt, its parameters and its seed, never on the
rows around it or on when it joined (model/sampling.py).

`tick` is one boundary and one step, for tests to drive; `run` is the serving thread's loop.
Requests and jobs come from other threads (`submit`, `call`); their answers go back through the
callbacks they carry.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Generation
from composer_prime.inference.engines.hf.batch import DeviceBatch

log = logging.getLogger(__name__)
GATHER_S = 0.005  # the oldest waiting request waits this long for others, to be prefilled with them


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    reply: Callable[[Generation | BaseException], None]
    seed: int = 0
    arrived: float = 0.0
    states: torch.Tensor | None = None  # its tokens' last hidden states, set before `reply` where the batch keeps them

    def __post_init__(self) -> None:
        self.seed = self.params.seed if self.params.seed is not None else random.getrandbits(63)
        self.arrived = time.monotonic()


@dataclass
class Job:
    fn: Callable[[], Any]
    reply: Callable[[Any], None]
    exclusive: bool  # waits until no request is in flight (a weight swap)


class Scheduler:
    def __init__(self, batch: DeviceBatch, step: Callable[[int, int, bool], None] | None = None,
                 shape: Callable[[int, int], tuple[int, int]] | None = None, gather_s: float = 0.0) -> None:
        """`step(b, w, use_top_p)` decodes (default: the batch's own step); `shape(n, w)` gives the
        (rows, width) to run for n live rows attending over w slots (default: exactly those). Waiting
        requests are admitted once the oldest has waited `gather_s`: requests that trickle in are
        prefilled a few together, not one prefill (a whole forward's launches on a GPU) per step."""
        self.batch, self.gather_s = batch, gather_s
        self.step = step or batch.decode_step
        self.shape = shape or (lambda n, w: (n, w))
        self.live: list[Request] = []  # row i decodes live[i]
        self.length: list[int] = []  # row i's position, as on the device (no need to read it back)
        self.waiting: deque[Request] = deque()
        self.jobs: deque[Job] = deque()
        self.cond = threading.Condition()
        self.stopping = False
        self.steps = 0

    def submit(self, request: Request) -> None:
        with self.cond:
            self.waiting.append(request)
            self.cond.notify()

    def call(self, fn: Callable[[], Any], reply: Callable[[Any], None], exclusive: bool = False) -> None:
        """Run fn() at a step boundary; reply(its result or its exception)."""
        with self.cond:
            self.jobs.append(Job(fn, reply, exclusive))
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()

    def run(self) -> None:
        while True:
            with self.cond:
                while not (self.stopping or self.jobs or self.live):
                    if not self.waiting:
                        self.cond.wait()
                    elif (left := self._due_in()) > 0:
                        self.cond.wait(left)
                    else:
                        break
                if self.stopping:
                    return
            self.tick()

    def _due_in(self) -> float:
        """Seconds until the waiting requests may be admitted."""
        return self.waiting[0].arrived + self.gather_s - time.monotonic()

    def tick(self) -> None:
        """One step boundary, then one decode step if any row is live."""
        self._run_jobs()
        self._admit()
        if not self.live:
            return
        try:
            n = len(self.live)
            b, w = self.shape(n, max(self.length) + 1)
            self.step(b, w, any(r.params.top_p < 1 for r in self.live))
            self.steps += 1
            self.length = [k + 1 for k in self.length]
            self._retire()
        except Exception as e:  # noqa: BLE001 - fail what was in flight, keep serving
            self._fail_all(e)

    def _run_jobs(self) -> None:
        with self.cond:
            ready = [j for j in self.jobs if not (j.exclusive and self.live)]
            for j in ready:
                self.jobs.remove(j)
        for job in ready:
            try:
                result = job.fn()
            except Exception as e:  # noqa: BLE001 - the caller gets it
                result = e
            job.reply(result)

    def _admit(self) -> None:
        with self.cond:  # jobs and waiting are appended by other threads: read them under the lock only
            if any(j.exclusive for j in self.jobs) or not self.waiting or self._due_in() > 0:
                return  # an exclusive job (a weight swap) holds new requests back until it has run
            new = [self.waiting.popleft() for _ in range(min(len(self.waiting), self.batch.rows - len(self.live)))]
        if not new:
            return
        lo = len(self.live)
        self.live += new
        self.length += [len(r.prompt) for r in new]
        try:
            self.batch.admit(lo, [(r.prompt, r.params, r.seed) for r in new], any(r.params.top_p < 1 for r in new))
            self._retire()  # a first token may already finish a request
        except Exception as e:  # noqa: BLE001
            self._fail_all(e)

    def _retire(self) -> None:
        done = self.batch.finished(len(self.live))
        if not done:
            return
        for row, (tokens, logprobs, stopped, states) in zip(done, self.batch.results(done)):
            r = self.live[row]
            r.states = states
            r.reply(Generation(list(r.prompt), tokens, logprobs, "stop" if stopped else "length"))
        keep, finished = len(self.live) - len(done), set(done)
        holes = [row for row in done if row < keep]
        movers = [row for row in range(keep, len(self.live)) if row not in finished]
        self.batch.move(movers, holes, max((self.length[m] + 1 for m in movers), default=0))
        self.batch.free([row for row in done if row >= keep])
        for src, dst in zip(movers, holes):
            self.live[dst], self.length[dst] = self.live[src], self.length[src]
        del self.live[keep:], self.length[keep:]

    def _fail_all(self, error: BaseException) -> None:
        log.error(f"decoding failed, {len(self.live)} requests answered with the error: {error!r}")
        for r in self.live:
            r.reply(error)
        if self.live:
            self.batch.free(list(range(len(self.live))))
        self.live, self.length = [], []

    def drain(self, max_steps: int = 100_000) -> None:
        """Tick until nothing is waiting or in flight (tests and benchmarks, on the calling thread)."""
        t = time.perf_counter()
        for _ in range(max_steps):
            if not (self.live or self.waiting or self.jobs):
                return
            self.tick()
        raise RuntimeError(f"not drained after {max_steps} steps ({time.perf_counter() - t:.1f}s)")

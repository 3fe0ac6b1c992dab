"""Where the trainer's batches come from: the one parameter that tells `rl`'s trainer and `sft` apart.

The loop (`train.fit`) asks its source for the batch of each step and trains on it with the same
step, whatever the source: `ZmqSource` receives the orchestrator's batches (rank 0 listens, every
rank gets the batch), `sft`'s source draws them from a local dataset (trainer/sft.py). Both hand
over the wire types (`Batch` of `Sample`s), checked by the objective's channels.
"""

from __future__ import annotations

import logging
import random
from typing import Callable, Protocol

import torch.distributed as dist

from composer_prime.contract.batches import Batch, Sample, SchemaError
from composer_prime.trainer.loss import Objective
from composer_prime.transports.batches.zmq import BatchReceiver
from composer_prime.utils import watchdog
from composer_prime.utils.progress import StillWaiting

log = logging.getLogger(__name__)


class BatchSource(Protocol):
    def batch(self, step: int, objective: Objective) -> Batch:
        """The batch of `step`, the same on every rank, checked by `objective`'s channels."""


class ZmqSource:
    """The orchestrator's batches. `receiver` on rank 0, None on the other ranks."""

    def __init__(self, receiver: BatchReceiver | None) -> None:
        self.receiver = receiver

    def batch(self, step: int, objective: Objective) -> Batch:
        """Rank 0 waits for the batch of `step`, telling the orchestrator every second that it does (so after
        a restart the orchestrator regenerates from here). Batches of other steps were meant for the trainer
        before a restart, older or queued ahead of it: dropped. Each channel checks its own data on
        arrival, so a malformed batch is refused, not trained on."""
        box: list = [None]
        if self.receiver is not None:
            watchdog.ready()  # loaded and waiting: the first batch is next (said once)
            waiting = StillWaiting(f"batch {step}")
            with watchdog.waiting("orchestrator", f"batch {step}"):  # the watchdog's status, asked on a stall
                while box[0] is None:
                    self.receiver.announce(step)
                    try:
                        batch = self.receiver.recv(timeout_s=1)
                        if batch is not None:
                            objective.check(batch)
                    except SchemaError as e:
                        log.warning(f"rejected a message: {e}")
                        continue
                    if batch is None:
                        waiting.tick()
                    elif batch.step != step:
                        log.info(f"dropped batch {batch.step}: expecting {step}")
                    else:
                        box[0] = batch
        dist.broadcast_object_list(box, src=0)
        return box[0]


class DatasetSource:
    """`batch_size` examples per step from a local dataset of `size`, drawn with replacement by one
    generator seeded with `seed`, step after step (the order `sft` has always drawn in): every rank
    draws the same batches. `rows(i, key)` gives example i's samples (one for ce, two for a dpo
    pair), `key` naming this draw of it (a pair drawn twice in a batch is two pairs)."""

    def __init__(self, size: int, rows: Callable[[int, str], list[Sample]], batch_size: int, seed: int) -> None:
        self.size, self.rows, self.batch_size = size, rows, batch_size
        self.rng, self.next_step = random.Random(seed), 0

    def batch(self, step: int, objective: Objective) -> Batch:
        if step != self.next_step:
            raise ValueError(f"batch {step} asked for, but the draws are at step {self.next_step}: steps come in order")
        self.next_step += 1
        picks = [self.rng.randrange(self.size) for _ in range(self.batch_size)]
        batch = Batch(step, [s for k, i in enumerate(picks) for s in self.rows(i, f"{i}@{k}")])
        objective.check(batch)
        return batch

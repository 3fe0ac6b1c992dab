"""The decode step on CUDA as replayed CUDA graphs: no per-kernel launch cost.

A small model's decode step is some thousand small kernels; launching them one by one from
Python takes longer than running them (DESIGN.md §8: 7 ms a step for SmolLM2-135M with a static
cache on the H100, against 0.09 ms to read its weights). `GraphedStep` records the step once per
shape and replays it afterwards. Shapes are bucketed so that few graphs serve every batch: the
row count to a power of two (or the batch's size), the attended width to a multiple of 64
slots; rows past the live ones are free ones (batch.py), slots past a row's position are
masked. With `compile`, the step is first compiled by Inductor (fused element-wise kernels,
fewer to replay) and the compiled code is what is recorded; on the CPU a compiled step is run as
it is (`scheduler_for` builds each variant). Measured on the CPU (tiny model, one thread) the
compiled step decodes 2.3x faster at batch 1 and 1.4x at batch 32 after 8-17 s of compiling,
SmolLM2-135M's no faster after 96 s: op by op stays the CPU's default.

Every tensor the step reads or writes is allocated before recording and lives as long as the
batch, and weights are swapped by copying into the same storage (engine.py), so a graph never
needs recording again. Graphs share one memory pool: nothing allocated inside one is read
after the next replays.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from composer_prime.inference.engines.hf.batch import DeviceBatch
from composer_prime.inference.engines.hf.scheduler import Scheduler

log = logging.getLogger(__name__)
WIDTH_BUCKET = 64

Step = Callable[[int, int, bool], None]


def bucket(n: int, w: int, rows: int, length: int) -> tuple[int, int]:
    """The recorded shape that covers n live rows attending over w slots. Never one row where two
    fit: torch.compile specialises a size of 1, so a one-row shape would be compiled apart."""
    b = max(2, 1 << max(0, n - 1).bit_length())
    return min(b, rows), min(-(-w // WIDTH_BUCKET) * WIDTH_BUCKET, length)


def compiled(step: Step) -> Step:
    """The step compiled once for every shape (sizes symbolic: one compile serves all buckets)."""
    return torch.compile(step, dynamic=True)


def scheduler_for(batch: DeviceBatch, graphs: str, gather_s: float = 0.0) -> Scheduler:
    """The continuous batch over `batch`, its step run as `graphs` (devices.resolve) says: off (op by
    op, exact shapes), capture (recorded CUDA graphs), compile (compiled; on CUDA then recorded)."""
    if graphs == "off":
        return Scheduler(batch, gather_s=gather_s)
    on_cuda = torch.device(batch.device).type == "cuda"
    step = GraphedStep(batch.decode_step, compile=graphs == "compile") if on_cuda else compiled(batch.decode_step)
    return Scheduler(batch, step, lambda n, w: bucket(n, w, batch.rows, batch.length), gather_s)


class GraphedStep:
    """step(b, w, use_top_p) as one CUDA graph per (b, w, use_top_p), recorded when first needed."""

    def __init__(self, step: Step, compile: bool = False) -> None:
        self.step: Step = compiled(step) if compile else step
        self.graphs: dict[tuple[int, int, bool], torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.record_s = 0.0

    def __call__(self, b: int, w: int, use_top_p: bool) -> None:
        graph = self.graphs.get((b, w, use_top_p))
        if graph is not None:
            graph.replay()
            return
        # The step itself, run on a side stream as the recipe wants (lazy initialisations, and a
        # compile, happen outside the recording); it is this call's real step. Recording runs nothing.
        t = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.step(b, w, use_top_p)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.step(b, w, use_top_p)
        self.pool = graph.pool()
        self.graphs[(b, w, use_top_p)] = graph
        self.record_s += time.perf_counter() - t
        log.debug(f"recorded the decode step for {b} rows x {w} slots (top-p {use_top_p}) in {time.perf_counter() - t:.2f}s")

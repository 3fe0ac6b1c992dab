"""What a decode step cannot beat on a device, measured there: the memory bandwidth (for bytes read
per step / bandwidth), the matmul throughput (for multiply-adds per step / that) and the cost of
one kernel launch or op dispatch (for ops per step x that).

On CUDA a step's ops are its kernels (counted by the profiler) and a launch costs what a trivial
kernel costs back to back, launched from Python one by one or replayed from a CUDA graph; on the
CPU they are the aten ops dispatched (counted by a dispatch mode) and an op costs what adding to a
one-element tensor costs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def clock(device: str) -> Callable[[], float]:
    """Wall time on CUDA; on the CPU this process's CPU time, which other load on a shared machine
    barely moves (what is timed runs on one thread: torch is set to one)."""
    return time.perf_counter if device == "cuda" else time.process_time


def best_of(fn: Callable[[], None], device: str, repeats: int = 5) -> float:
    """The fastest of `repeats` timed calls, in seconds (after one untimed call)."""
    fn()
    sync(device)
    times, now = [], clock(device)
    for _ in range(repeats):
        t = now()
        fn()
        sync(device)
        times.append(now() - t)
    return min(times)


def read_bandwidth(device: str) -> float:
    """Bytes per second a reduction reads from a tensor far larger than any cache."""
    x = torch.ones((1 << 30 if device == "cuda" else 1 << 28) // 4, device=device)
    return x.numel() * 4 / best_of(lambda: x.sum(), device)


def matmul_flops(device: str, dtype: torch.dtype) -> float:
    """Multiply-adds x 2 per second of a large square matmul in `dtype`: what compute can reach."""
    n = 4096 if device == "cuda" else 1024
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / best_of(lambda: a @ b, device)


def per_op_s(device: str, graph: bool = False, n: int = 2000) -> float:
    """Seconds per trivial op: dispatched one by one, or (CUDA) replayed from a graph of n of them."""
    x = torch.zeros(1, device=device)

    def ops() -> None:
        for _ in range(n):
            x.add_(1)

    if not graph:
        return best_of(ops, device) / n
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        ops()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ops()
    return best_of(g.replay, device) / n


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.n += 1
        return func(*args, **(kwargs or {}))


def ops_per_call(fn: Callable[[], None], device: str) -> int:
    """Kernels (CUDA) or non-view aten ops (CPU) one call of fn runs."""
    if device != "cuda":
        with _Count() as count:
            fn()
        return count.n
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


# A kernel launch in Inductor's generated `call`: a fused kernel (C++ on the CPU, Triton on CUDA), an
# extern kernel (matmuls) or an aten op it falls back to (attention, cumsum, searchsorted).
_LAUNCH = re.compile(r"^\s*(?:\w+ = )?(?:cpp_fused_\w+\(|triton_\w+\.run\(|extern_kernels\.\w+\(|torch\.ops\.\w+\.\w+)", re.M)


class _Generated(Exception):
    """Raised once Inductor has generated a graph's code, so that none of it is compiled."""


def compiled_launches(fn: Callable[..., None], *args) -> int:
    """Kernels that torch.compile's code for one call of fn(*args) launches (fn compiled with dynamic
    shapes, as the embedded engine's "compile" step is): counted in the code Inductor generates, so
    the CPU counts what fusion leaves, and CUDA would replay about as many from its graph. Inductor
    stops once it has generated that code: its C++ or Triton is never compiled (8.7 s of CPU of the
    two counts' 32, cold, 2-core machine, 2026-11-28) and fn is not run. fn compiles to one graph
    (a graph break raises)."""
    from unittest import mock

    from torch._inductor.graph import GraphLowering

    codes: list[str] = []

    def generate_only(self: GraphLowering):
        wrapper, _ = self.codegen_with_cpp_wrapper() if self.cpp_wrapper else self.codegen()
        codes.append(wrapper.value)
        raise _Generated

    torch._dynamo.reset()
    with mock.patch.object(GraphLowering, "compile_to_module", generate_only), \
            torch._inductor.config.patch(fx_graph_cache=False):
        try:
            torch.compile(fn, dynamic=True)(*args)
        except Exception as e:
            cause = e
            while cause is not None and not isinstance(cause, _Generated):
                cause = cause.__cause__ or cause.__context__
            if cause is None:
                raise
    torch._dynamo.reset()
    if len(codes) != 1:
        raise AssertionError(f"{len(codes)} graphs generated, one expected")
    return len(_LAUNCH.findall(codes[0][codes[0].index("def call("):]))

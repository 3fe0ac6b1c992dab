"""torchft's FP8 all-reduce (collectives.allreduce_quantized, the wire of `wire_dtype = "quantized"`)
run on the CPU: its Triton kernels under Triton's interpreter, its all-to-all and all-gather over a
real gloo group of two ranks (two threads) on loopback.

    TRITON_INTERPRET=1 python tests/support/fp8_wire_probe.py OUT.pt

Three stand-ins for what torchft expects of a GPU, nothing else changed: e4m3 as on a Hopper GPU
(torchft picks int8 where the device has no native FP8, and there is no device here); no accelerator
stream to order the kernels after (a stand-in stream that waits on nothing); and one interpreted
kernel at a time (the interpreter patches Triton's language while a kernel runs: two ranks' kernels
at once fail). Each rank all-reduces (sums) its own pseudo-gradients: a layer's weight (2-D: one
scale per row) and a norm's (1-D, seeded normals: torchft makes it a column, one scale per value);
torchft's Manager then divides by the number of islands, as here. OUT gets both ranks' inputs and results.

The weight's rows are values FP8 holds exactly, so that the codec rounds nothing and the mean comes
back exact wherever every row went where it should: e4m3 numbers times a power of two, each row
holding +-448 (its scale then a power of two too), and by row either rank 0's values and rank 1's
zeros, the reverse, or both the same. Exact, because Triton 3.9's interpreter rounds fp32 to e4m3
wrongly where rounding carries into the next power of two (124.7 to 64, not 128): its rounding is no
measure of a GPU's (the codec's error is test_diloco_replicas.py's, in torch's e4m3 and on CUDA).
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta

if os.environ.get("TRITON_INTERPRET") != "1":  # read when torchft's kernels are defined, at import
    raise SystemExit("run with TRITON_INTERPRET=1: torchft's Triton kernels on the CPU need Triton's interpreter")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torchft.collectives as collectives  # noqa: E402
import torchft.quantization as quantization  # noqa: E402
from torch.distributed import ReduceOp  # noqa: E402
from torchft.process_group import ProcessGroupGloo  # noqa: E402

SHAPES = [(12, 32), (16,)]
RANKS = 2
UNIT = 2.0**-14  # a weight's values are e4m3 numbers times this


def exact_rows(gen: torch.Generator) -> list[torch.Tensor]:
    """Both ranks' weights: e4m3 values times UNIT, each row holding +-448; row r is rank 0's alone
    (r % 3 == 0), rank 1's alone (1), or the same on both (2)."""
    def e4m3(shape: tuple[int, ...]) -> torch.Tensor:
        v = (torch.randn(shape, generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn).float()
        v[:, 0] = 448.0 * torch.sign(torch.randn(shape[0], generator=gen))
        return v * UNIT
    a, b = e4m3(SHAPES[0]), e4m3(SHAPES[0])
    kind = torch.arange(SHAPES[0][0]) % 3
    a[kind == 1] = 0.0
    b[kind == 0] = 0.0
    b[kind == 2] = a[kind == 2]
    return [a, b]


class HostStream:
    """The stream torchft orders its kernels after: on the CPU there is nothing to wait for."""

    def wait_stream(self, other: object) -> None:
        pass


def one_at_a_time(fn, lock: threading.Lock):
    def call(*args, **kwargs):
        with lock:
            return fn(*args, **kwargs)
    return call


def main(out: str) -> None:
    quantization._supports_native_fp8 = lambda: True  # e4m3, as torchft quantizes on an H100
    torch.accelerator.current_stream = lambda *args: None  # torchft asks; HostStream ignores it
    lock = threading.Lock()
    for name in ("fused_quantize_into_fp8", "fused_reduce_fp8", "fused_dequantize_from_fp8"):
        setattr(collectives, name, one_at_a_time(getattr(collectives, name), lock))
    gen = torch.Generator().manual_seed(0)
    weights = exact_rows(gen)
    deltas = [[weights[r], torch.randn(SHAPES[1], generator=gen) * 1e-2] for r in range(RANKS)]
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results: dict[int, list[torch.Tensor]] = {}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            pg = ProcessGroupGloo(timeout=timedelta(seconds=60))
            pg.configure(f"127.0.0.1:{store.port}/fp8", "probe", r, RANKS)
            tensors = [d.clone() for d in deltas[r]]
            collectives.allreduce_quantized(tensors, ReduceOp.SUM, pg, HostStream()).get_future().wait()
            results[r] = [(t / RANKS).reshape(s) for t, s in zip(tensors, SHAPES)]  # the Manager's AVG
        except BaseException as e:  # noqa: BLE001 - said by the main thread
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    torch.save({"deltas": deltas, "results": [results[r] for r in range(RANKS)]}, out)


if __name__ == "__main__":
    main(sys.argv[1])

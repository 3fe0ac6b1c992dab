"""An environment's calls under a time limit (env_runtime/calls.py `CallBox`), with real threads and
real hangs: a call that blocks its thread (time.sleep under an `async def`, which no cancellation
reaches) and one that awaits forever are both cut at the box's timeout, each naming the function it
hung in; the awaiting one is cancelled and frees its thread, the blocked one's thread is abandoned
and used again once it returns; past `MAX_STUCK` abandoned calls, calls are refused at once (no
thread is started for them); results and errors pass through."""

import asyncio
import threading
import time
from pathlib import Path

import pytest

from composer_prime.env_runtime import calls
from composer_prime.env_runtime.calls import CallBox, CallTimeout

HERE = Path(__file__).parent
release = threading.Event()


async def blocks() -> None:
    while not release.is_set():
        time.sleep(0.05)  # the blocking hang


async def awaits() -> None:
    await asyncio.sleep(3600)  # the awaiting hang


async def fine(x: int) -> int:
    return x


async def fails() -> None:
    raise ValueError("the reward's own error")


def line(marker: str) -> int:
    return next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.endswith(marker))


def test_hung_calls_are_cut_named_and_their_threads_bounded_and_reused(monkeypatch):
    monkeypatch.setattr(calls, "MAX_STUCK", 2)
    release.clear()

    async def run() -> None:
        box = CallBox("my-env", 0.3, HERE)
        assert await box.call(lambda: fine(7), "task 1", "my-env's reward function") == 7
        with pytest.raises(ValueError, match="the reward's own error"):
            await box.call(fails, "task 2", "my-env's reward function")
        for make, marker in ((blocks, "# the blocking hang"), (awaits, "# the awaiting hang")):
            with pytest.raises(CallTimeout) as e:
                await box.call(make, "task 3", "my-env's reward function")
            assert e.value.where == f"env_runtime/test_calls.py:{line(marker)} in {make.__name__}"
            assert str(e.value) == f"my-env's reward function did not return in 0.3 s (task 3): stuck in {e.value.where}"
        await asyncio.sleep(0.2)
        assert box.stuck == 1  # the awaiting call was cancelled in its loop; the blocked one still runs
        with pytest.raises(CallTimeout):
            await box.call(blocks, "task 4", "my-env's reward function")
        threads = threading.active_count()
        with pytest.raises(CallTimeout, match="2 calls are still hung past 0.3 s, so no more are started"):
            await box.call(lambda: fine(8), "task 5", "my-env's reward function")
        assert threading.active_count() == threads and box.stuck == 2  # refused: no thread started
        release.set()
        deadline = time.monotonic() + 10
        while box.stuck and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert box.stuck == 0 and await box.call(lambda: fine(9), "task 6", "my-env's reward function") == 9
        assert threading.active_count() <= threads  # the returned threads took the call: none more

    try:
        asyncio.run(run())
    finally:
        release.set()

"""Micro-batcher: concurrent callers share batches; admission is bounded; errors reach every caller."""

from __future__ import annotations

import asyncio
import threading

import pytest

from llds_retriever.batcher import MicroBatcher
from llds_retriever.errors import SaturatedError


def test_concurrent_submits_share_one_batch() -> None:
    sizes: list[int] = []

    def run(items: list[int]) -> list[int]:
        sizes.append(len(items))
        return [x * 10 for x in items]

    async def main() -> list[list[int]]:
        b: MicroBatcher[int, int] = MicroBatcher(run, max_batch=64, max_wait_s=0.05, max_queue=100)
        await b.start()
        try:
            return await asyncio.gather(*(b.submit([i]) for i in range(20)), b.submit([100, 101]))
        finally:
            await b.stop()

    out = asyncio.run(main())
    assert out[:20] == [[i * 10] for i in range(20)]
    assert out[20] == [1000, 1010]
    assert sizes == [22]


def test_max_batch_splits_batches() -> None:
    sizes: list[int] = []

    def run(items: list[int]) -> list[int]:
        sizes.append(len(items))
        return items

    async def main() -> None:
        b: MicroBatcher[int, int] = MicroBatcher(run, max_batch=8, max_wait_s=0.05, max_queue=100)
        await b.start()
        await asyncio.gather(*(b.submit([i]) for i in range(20)))
        await b.stop()

    asyncio.run(main())
    assert sizes == [8, 8, 4]


def test_saturation_rejects_at_once() -> None:
    gate = threading.Event()

    def run(items: list[int]) -> list[int]:
        gate.wait(5)
        return items

    async def main() -> None:
        b: MicroBatcher[int, int] = MicroBatcher(
            run, max_batch=4, max_wait_s=0.0, max_queue=3, retry_after_s=2
        )
        await b.start()
        first = asyncio.create_task(b.submit([1, 2]))
        await asyncio.sleep(0.05)
        with pytest.raises(SaturatedError) as err:
            await b.submit([3, 4])  # 2 in flight + 2 > 3
        assert err.value.retry_after_s == 2
        gate.set()
        assert await first == [1, 2]
        assert b.in_flight == 0
        assert await b.submit([5, 6, 7]) == [5, 6, 7]
        await b.stop()

    asyncio.run(main())


def test_batch_error_reaches_every_caller_and_loop_survives() -> None:
    calls = []

    def run(items: list[int]) -> list[int]:
        calls.append(items)
        if len(calls) == 1:
            raise ValueError("boom")
        return items

    async def main() -> None:
        b: MicroBatcher[int, int] = MicroBatcher(run, max_batch=8, max_wait_s=0.02, max_queue=10)
        await b.start()
        results = await asyncio.gather(b.submit([1]), b.submit([2]), return_exceptions=True)
        assert all(isinstance(r, ValueError) for r in results)
        assert await b.submit([3]) == [3]
        await b.stop()

    asyncio.run(main())


def test_sequential_traffic_skips_the_gathering_window() -> None:
    async def main() -> list[float]:
        b: MicroBatcher[int, int] = MicroBatcher(lambda xs: xs, max_batch=8, max_wait_s=0.2, max_queue=10)
        await b.start()
        took = []
        for i in range(3):
            t0 = asyncio.get_running_loop().time()
            await b.submit([i])
            took.append(asyncio.get_running_loop().time() - t0)
        await b.stop()
        return took

    took = asyncio.run(main())
    assert took[0] >= 0.19  # no history yet: the window applies
    assert max(took[1:]) < 0.1  # the previous batch held one query: no waiting

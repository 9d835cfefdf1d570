"""Cross-request dynamic micro-batching with bounded admission.

Concurrent requests put their queries on one asyncio queue. A single loop takes the first waiting
query, gathers more for at most ``max_wait_s`` (or until ``max_batch``), and runs the whole batch as
one call in a worker thread, so the event loop keeps accepting requests meanwhile. While a batch
runs, new queries pile up and the next batch takes them at once: the batch size grows with the load
instead of the latency. While the previous batch held a single query (sequential traffic) the
gathering window is skipped, so a lone client pays no wait. Admission is bounded: when ``max_queue`` queries are already waiting or
running, ``submit`` raises ``SaturatedError`` at once (the server answers 503 + Retry-After).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from llds_retriever.errors import SaturatedError

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    """Gathers items from concurrent callers into batches for ``run_batch`` (called in a thread)."""

    def __init__(
        self,
        run_batch: Callable[[list[T]], Sequence[R]],
        max_batch: int,
        max_wait_s: float,
        max_queue: int,
        retry_after_s: int = 1,
        on_batch: Callable[[int], None] | None = None,
    ):
        self._run_batch = run_batch
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.retry_after_s = retry_after_s
        self._on_batch = on_batch
        self._queue: asyncio.Queue[tuple[T, asyncio.Future[R]]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="batch")
        self.in_flight = 0
        """Items admitted and not yet answered (waiting or running)."""
        self._last_batch = 2

    async def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._loop(), name="micro-batcher")

    async def stop(self) -> None:
        """Stop the loop; queued callers get CancelledError."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._queue is not None:
            while not self._queue.empty():
                _, fut = self._queue.get_nowait()
                fut.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, items: list[T]) -> list[R]:
        """Answer ``items`` (in order) as part of shared batches; SaturatedError when full."""
        if self._queue is None:
            raise RuntimeError("MicroBatcher.start() was not called")
        if self.in_flight + len(items) > self.max_queue:
            raise SaturatedError(self.in_flight, self.max_queue, self.retry_after_s)
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[R]] = []
        for item in items:
            fut: asyncio.Future[R] = loop.create_future()
            self._queue.put_nowait((item, fut))
            futs.append(fut)
        self.in_flight += len(items)
        try:
            return list(await asyncio.gather(*futs))
        finally:
            self.in_flight -= len(items)
            for f in futs:
                if f.done() and not f.cancelled():
                    f.exception()  # marks a shared batch error as seen on every future
                f.cancel()  # no-op when done; drops our items from later batches if we were cancelled

    async def _gather(self) -> list[tuple[T, asyncio.Future[R]]]:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        batch = [await self._queue.get()]
        # While traffic is sequential (the last batch held one item) waiting only adds latency;
        # one concurrent arrival turns the window back on for the next batch.
        deadline = loop.time() + (self.max_wait_s if self._last_batch > 1 else 0.0)
        while len(batch) < self.max_batch:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        self._last_batch = len(batch)
        return [(item, fut) for item, fut in batch if not fut.done()]

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            if not batch:
                continue
            if self._on_batch is not None:
                self._on_batch(len(batch))
            try:
                results = await loop.run_in_executor(self._executor, self._run_batch, [i for i, _ in batch])
            except Exception as e:  # handed to every caller of the batch, which reports it
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            for (_, fut), res in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(res)

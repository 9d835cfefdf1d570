"""Bounded admission of ``/answer`` requests: at most ``max_in_flight`` run, ``max_queued`` wait.

Past both, a request is refused at once (:class:`AnswerSaturatedError`, 503 with ``Retry-After`` at
the edge) instead of joining an unbounded queue where overload shows only as growing latency and
clients time out. Waiting requests start in arrival order. Single event loop, no locks: every count
changes between two awaits.

    ticket = admission.admit()      # raises AnswerSaturatedError when full
    try:
        await ticket.wait()         # returns once the request holds a running slot
        ...
    finally:
        ticket.release()            # idempotent; also right for a ticket that never ran
"""

from __future__ import annotations

import asyncio
import time
from collections import deque


class AnswerSaturatedError(RuntimeError):
    """Every running and queued ``/answer`` slot is taken (-> 503 with ``Retry-After``)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class AnswerAdmission:
    """Counts of running and waiting answers, and the FIFO of waiters."""

    def __init__(self, max_in_flight: int, max_queued: int, retry_after_s: float = 1.0) -> None:
        if max_in_flight < 1 or max_queued < 0:
            raise ValueError(
                f"need max_in_flight >= 1 and max_queued >= 0, got {max_in_flight}, {max_queued}"
            )
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self.rejected = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def admit(self) -> AnswerTicket:
        """A ticket that runs now or waits its turn; :class:`AnswerSaturatedError` when both are full."""
        if self.in_flight < self.max_in_flight:
            self.in_flight += 1
            return AnswerTicket(self, None)
        if len(self._waiting) < self.max_queued:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append(fut)
            return AnswerTicket(self, fut)
        self.rejected += 1
        raise AnswerSaturatedError(
            f"answer capacity full: {self.in_flight} running (answer_max_in_flight = {self.max_in_flight}) "
            f"and {len(self._waiting)} queued (answer_max_queued = {self.max_queued}); retry after "
            f"{self.retry_after_s:g} s",
            self.retry_after_s,
        )

    def _hand_over(self) -> None:
        """A running slot was freed: give it to the oldest waiter, else count it free."""
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes on: in_flight stays
                return
        self.in_flight -= 1

    def _withdraw(self, fut: asyncio.Future[None]) -> None:
        try:
            self._waiting.remove(fut)
        except ValueError:
            pass


class AnswerTicket:
    """One admitted request: waiting for a slot, running, or released."""

    def __init__(self, admission: AnswerAdmission, waiter: asyncio.Future[None] | None) -> None:
        self._admission = admission
        self._waiter = waiter
        self._running = waiter is None
        self._released = False
        self.queued_s = 0.0

    async def wait(self) -> None:
        """Return once this request holds a running slot (at once if it was admitted running)."""
        if self._running or self._waiter is None:
            return
        t0 = time.perf_counter()
        try:
            await self._waiter
        except asyncio.CancelledError:
            if self._waiter.done() and not self._waiter.cancelled():
                self._running = True  # handed a slot just before the cancel: release() frees it
            else:
                self._waiter.cancel()
                self._admission._withdraw(self._waiter)
            raise
        self.queued_s = time.perf_counter() - t0
        self._running = True

    def release(self) -> None:
        """Free this request's running slot or queue place (idempotent)."""
        if self._released:
            return
        self._released = True
        if self._running:
            self._admission._hand_over()
        elif self._waiter is not None:
            if self._waiter.done() and not self._waiter.cancelled():
                self._admission._hand_over()  # a slot was handed over but never used
            else:
                self._waiter.cancel()
                self._admission._withdraw(self._waiter)

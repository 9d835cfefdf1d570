"""/answer admission: bounded running and queued slots, FIFO hand-over, no slot lost to a cancel."""

from __future__ import annotations

import asyncio

import pytest

from llds_rollout.answer_admission import AnswerAdmission, AnswerSaturatedError, AnswerTicket


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_capacity_is_running_plus_queued_and_the_excess_is_refused_with_a_message() -> None:
    async def main() -> None:
        adm = AnswerAdmission(max_in_flight=2, max_queued=1, retry_after_s=2.5)
        tickets = [adm.admit() for _ in range(3)]
        assert (adm.in_flight, adm.queued) == (2, 1)
        with pytest.raises(AnswerSaturatedError) as e:
            adm.admit()
        assert e.value.retry_after_s == 2.5
        assert "answer_max_in_flight = 2" in str(e.value) and "answer_max_queued = 1" in str(e.value)
        assert adm.rejected == 1
        for t in tickets:
            t.release()
        assert (adm.in_flight, adm.queued) == (0, 0)

    run(main())


def test_waiters_start_in_arrival_order_as_slots_free() -> None:
    async def main() -> None:
        adm = AnswerAdmission(max_in_flight=1, max_queued=3)
        first = adm.admit()
        started: list[int] = []

        async def request(i: int) -> None:
            t = adm.admit()
            try:
                await t.wait()
                started.append(i)
                await asyncio.sleep(0)
            finally:
                t.release()

        tasks = [asyncio.create_task(request(i)) for i in range(3)]
        await asyncio.sleep(0)
        assert started == [] and adm.queued == 3
        first.release()
        await asyncio.gather(*tasks)
        assert started == [0, 1, 2]
        assert (adm.in_flight, adm.queued) == (0, 0)

    run(main())


async def _cancel_a_waiter(hand_over_first: bool) -> tuple[AnswerAdmission, AnswerTicket]:
    """One running ticket, one waiter whose wait is cancelled (after the running ticket handed it its
    slot, with ``hand_over_first``) and then released; returns the admission and the running ticket."""
    adm = AnswerAdmission(max_in_flight=1, max_queued=1)
    first = adm.admit()
    waiter = adm.admit()
    task = asyncio.create_task(waiter.wait())
    await asyncio.sleep(0)
    if hand_over_first:
        first.release()  # hands the slot over: the waiter's future is resolved ...
    task.cancel()  # ... and the waiter is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await task
    waiter.release()
    return adm, first


def test_a_cancelled_waiter_gives_back_its_queue_place() -> None:
    async def main() -> None:
        adm, first = await _cancel_a_waiter(hand_over_first=False)
        assert adm.queued == 0
        adm.admit().release()  # its queue place is free again: admitting one more does not raise
        first.release()
        assert (adm.in_flight, adm.queued) == (0, 0)

    run(main())


def test_a_slot_handed_to_a_waiter_cancelled_before_it_resumed_is_not_lost() -> None:
    async def main() -> None:
        adm, _ = await _cancel_a_waiter(hand_over_first=True)
        assert (adm.in_flight, adm.queued) == (0, 0)
        # and a ticket that never waited at all (a request that failed before) frees its place too
        a, b = adm.admit(), adm.admit()
        b.release()
        a.release()
        assert (adm.in_flight, adm.queued) == (0, 0)

    run(main())


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="max_in_flight >= 1"):
        AnswerAdmission(max_in_flight=0, max_queued=1)

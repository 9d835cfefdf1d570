"""Stream trimming on the real Valkey server: acknowledged entries vanish, pending and undelivered
ones never do (:meth:`llds_trainer.queue.StreamQueue.trim`)."""

from __future__ import annotations

import pytest
import redis

from llds_proto import streams
from llds_trainer.queue import StreamQueue, _next_id

pytestmark = pytest.mark.integration
STREAM = streams.RunKeys("trim-test").stream


def _ids(r: redis.Redis) -> list[str]:
    return [eid.decode() for eid, _ in r.xrange(STREAM)]


def _add(r: redis.Redis, n: int) -> list[str]:
    return [r.xadd(STREAM, {streams.GROUP_FIELD: b"x"}).decode() for _ in range(n)]


def test_trim_keeps_pending_and_undelivered_entries(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    q = StreamQueue(r, "trainer-0", stream=STREAM)
    assert q.trim() == 0  # no stream yet
    q.ensure_group()
    assert q.trim() == 0  # empty stream, nothing delivered
    ids = _add(r, 6)
    assert q.trim() == 0 and _ids(r) == ids  # nothing delivered yet
    got = q.fetch(3, lambda: False)
    assert [e.entry_id for e in got] == ids[:3]
    assert q.trim() == 0  # the oldest entry is pending
    q.ack([ids[1]])
    assert q.trim() == 0 and _ids(r) == ids  # ids[1] is acked but sits behind the pending ids[0]
    q.ack([ids[0]])
    assert q.trim() == 2 and _ids(r) == ids[2:]
    q.ack([ids[2]])
    # Nothing pending: the cut is right after the last delivered entry; the 3 undelivered stay.
    assert q.trim() == 1 and _ids(r) == ids[3:]
    assert [e.entry_id for e in q.fetch(3, lambda: False)] == ids[3:]
    q.ack(ids[3:])
    assert q.trim() == 3 and r.xlen(STREAM) == 0
    assert q.trim() == 0
    # New entries after an empty, trimmed stream are all kept until consumed.
    more = _add(r, 2)
    assert q.trim() == 0 and _ids(r) == more


def test_trim_respects_other_consumers_and_other_groups(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    q = StreamQueue(r, "trainer-0", stream=STREAM)
    q.ensure_group()
    ids = _add(r, 4)
    dead = StreamQueue(r, "trainer-dead", stream=STREAM)
    assert [e.entry_id for e in dead.fetch(2, lambda: False)] == ids[:2]  # never acknowledged
    q.ack([e.entry_id for e in q.fetch(2, lambda: False)])
    assert q.trim() == 0 and _ids(r) == ids  # the dead consumer's entries are still needed
    dead.ack(ids[:2])
    assert q.trim() == 4 and r.xlen(STREAM) == 0
    # A second consumer group that has read nothing yet holds everything after its position.
    ids = _add(r, 3)
    r.xgroup_create(STREAM, "auditors", id=ids[0])  # it has "delivered" up to ids[0]
    q.ack([e.entry_id for e in q.fetch(3, lambda: False)])
    assert q.trim() == 1 and _ids(r) == ids[1:]


def test_next_id_is_the_smallest_greater_id() -> None:
    assert _next_id((5, 0)) == (5, 1)
    assert _next_id((0, 0)) == (0, 1)
    assert _next_id((7, 2**64 - 1)) == (8, 0)

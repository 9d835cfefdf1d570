"""What an admission decision reads is one consistent moment of Redis, on a real Valkey.

The trainer acknowledges a step's entries and writes its info in one MULTI/EXEC; a rollout that read
the info and the queue with separate commands could pair the info from before a step with the queue
from after it, and admit a step's worth of groups too many (they go stale). Here a writer plays the
trainer as fast as Redis lets it (each transaction acknowledges one entry and sets ``step`` to the
number acknowledged) while the rollout's :func:`read_view` reads; every view must pair them exactly.
Read command by command, hundreds of the views in this test are torn.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis
import redis.asyncio as aioredis

from llds_proto.messages import TrainerInfo
from llds_proto.streams import TRAINER_GROUP, RunKeys
from llds_rollout.scheduler import read_view

pytestmark = pytest.mark.integration

ENTRIES = 3000


def _info(keys: RunKeys, step: int) -> str:
    return TrainerInfo(
        run_id=keys.run_id, version=step, step=step, groups_per_step=1, publish_every=1, staleness_k=1
    ).model_dump_json()


def test_info_and_acknowledgements_are_read_together(redis_url: str) -> None:
    keys = RunKeys("view-audit")
    r = redis.Redis.from_url(redis_url)
    r.xgroup_create(keys.stream, TRAINER_GROUP, id="0", mkstream=True)
    ids = [r.xadd(keys.stream, {"g": b"x"}) for _ in range(ENTRIES)]
    r.xreadgroup(TRAINER_GROUP, "trainer", {keys.stream: ">"}, count=ENTRIES)  # all pending
    r.set(keys.trainer_info, _info(keys, 0))
    started = threading.Event()

    def trainer() -> None:
        started.set()
        for step, eid in enumerate(ids, start=1):
            pipe = r.pipeline(transaction=True)
            pipe.xack(keys.stream, TRAINER_GROUP, eid)
            pipe.set(keys.trainer_info, _info(keys, step))
            pipe.execute()

    async def read_all(writer: threading.Thread) -> list[tuple[int, int | None, int]]:
        client = aioredis.Redis.from_url(redis_url)
        seen = []
        try:
            while writer.is_alive():
                v = await read_view(client, keys)
                assert v.info is not None
                seen.append((v.info.step, v.acked, v.unacked))
        finally:
            await client.aclose()
        return seen

    writer = threading.Thread(target=trainer)
    writer.start()
    started.wait()
    seen = asyncio.run(read_all(writer))
    writer.join()
    assert len(seen) > 100, "the reader hardly overlapped the writer: the test would prove nothing"
    torn = [
        (step, acked, unacked) for step, acked, unacked in seen if acked != step or unacked != ENTRIES - step
    ]
    assert not torn, f"{len(torn)} of {len(seen)} views pair an info with another moment's queue: {torn[:5]}"
    # and the reader saw the writer move (not one moment read again and again)
    assert len({step for step, _, _ in seen}) > 50

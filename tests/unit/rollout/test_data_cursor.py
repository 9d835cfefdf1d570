"""The shared data order's claims (llds_rollout.cursor), on the real Redis server and on fakeredis's
Lua: every position below the cursor is in the stream, in the drop record or claimed; a position
reaches the stream at most once; dead claims are taken over, a failed attempt's at once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis

from llds_proto.streams import RunKeys
from llds_rollout.cursor import DataCursor


@pytest.fixture(params=["redis", "fakeredis"])
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "fakeredis":
        yield fakeredis.aioredis.FakeRedis()
    else:
        url = request.getfixturevalue("redis_url")
        yield aioredis.Redis.from_url(url)


KEYS = RunKeys("cursor-test")


async def _all(redis: Any) -> tuple[int, dict[int, str], list[tuple[bytes, dict[bytes, bytes]]]]:
    cursor = int(await redis.get(KEYS.data_cursor) or 0)
    claims = {int(k): v.decode() for k, v in (await redis.hgetall(KEYS.data_claims)).items()}
    return cursor, claims, await redis.xrange(KEYS.data_dropped)


def test_claims_are_fresh_positions_then_dead_ones_and_each_ends_once(client: Any) -> None:
    async def main() -> None:
        redis = client
        await redis.delete(KEYS.data_cursor, KEYS.data_claims, KEYS.data_dropped, KEYS.stream)
        a = DataCursor(redis, KEYS, "a-1", lease_s=0.5)
        b = DataCursor(redis, KEYS, "b-1", lease_s=0.5)
        got = [await a.claim(), await a.claim(), await b.claim()]
        assert [(c.position, c.attempts, c.retaken_from) for c in got] == [(0, 0, ""), (1, 0, ""), (2, 0, "")]
        cursor, claims, _ = await _all(redis)
        assert cursor == 3 and sorted(claims) == [0, 1, 2] and claims[2].startswith("b-1\t")

        # a's group at 0 is pushed: entry and claim end in one write; a second push adds nothing
        entry = await a.push(0, "group", b"\x00bytes\xff")
        assert entry is not None and await a.push(0, "group", b"again") is None
        assert [(e.decode(), f) for e, f in await redis.xrange(KEYS.stream)] == [
            (entry, {b"group": b"\x00bytes\xff"})
        ]
        # b cannot push or drop a's position
        assert await b.push(1, "group", b"x") is None and not await b.drop(1, "p", "g", "stale")
        assert await redis.xlen(KEYS.stream) == 1

        # b renews its claim, a does not: after the lease a's position 1 is b's (the oldest dead first)
        await asyncio.sleep(0.3)
        assert await b.renew([2, 1]) == 1  # 1 is not b's: not renewed
        await asyncio.sleep(0.35)
        again = await b.claim()
        assert (again.position, again.retaken_from, again.attempts) == (1, "a-1", 0)
        # an owner never takes over its own claim, however late its renewal: it is alive (it claims)
        await asyncio.sleep(0.6)
        assert (await b.claim()).position == 3
        assert await b.renew([2, 3]) == 2
        # a comes back: its push is refused (b owns the position now), nothing reaches the stream
        assert await a.push(1, "group", b"zombie") is None and await redis.xlen(KEYS.stream) == 1
        assert await a.renew([1]) == 0

        # a failed attempt gives its position back at once, counted; a new claim takes it first
        assert await b.release(1) == 1
        retry = await a.claim()
        assert (retry.position, retry.retaken_from, retry.attempts) == (1, "released", 1)
        # a drop is a record and the claim's end, in one write
        assert await a.drop(1, "world:7", "world:7:0:p1", "failed")
        cursor, claims, dropped = await _all(redis)
        assert cursor == 4 and sorted(claims) == [2, 3]
        assert [{k.decode(): v.decode() for k, v in f.items()} for _, f in dropped] == [
            {
                "position": "1",
                "prompt_id": "world:7",
                "group_id": "world:7:0:p1",
                "why": "failed",
                "producer": "a-1",
            }
        ]
        # a shutdown gives back without counting an attempt
        assert await b.release(2, failed=False) == 0
        assert (await a.claim()).position == 2 and (await a.claim()).position == 4

    asyncio.run(main())


def test_replicas_claiming_at_once_never_share_a_position(client: Any) -> None:
    async def main() -> None:
        redis = client
        await redis.delete(KEYS.data_cursor, KEYS.data_claims)
        cursors = [DataCursor(redis, KEYS, f"r{i}", lease_s=60) for i in range(4)]
        got = await asyncio.gather(*[c.claim() for c in cursors for _ in range(25)])
        assert sorted(c.position for c in got) == list(range(100))

    asyncio.run(main())


def test_an_owner_with_a_tab_is_refused() -> None:
    with pytest.raises(ValueError, match="tab"):
        DataCursor(fakeredis.aioredis.FakeRedis(), KEYS, "a\tb", lease_s=1)

"""Group production: push to the stream, admission control, staleness drops, Redis backpressure.

In-memory Redis (fakeredis) and a scripted engine; the real Redis path is in the integration tests.
The admission rule itself (capacities, replicas, catch-up) is in test_rollout_admission.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
from redis.exceptions import ConnectionError as RedisConnectionError
from rollout_fakes import FakeSearcher, ScriptedEngine

from llds_proto.codec import decode_group
from llds_proto.messages import TrainerInfo
from llds_proto.streams import DEFAULT_KEYS, DEFAULT_RUN_ID
from llds_rollout.agent import LoopSettings
from llds_rollout.dataset import PromptRow, endless
from llds_rollout.engine.base import GenerationRequest, GenerationResult
from llds_rollout.metrics import RolloutMetrics
from llds_rollout.scheduler import GroupProducer

ROWS = [
    PromptRow("world:0", "who wrote hamlet", ["Shakespeare"]),
    PromptRow("world:1", "capital of france", ["Paris"]),
]


class GatedEngine(ScriptedEngine):
    """Answers only while ``gate`` is set, so a test can hold groups in flight."""

    def __init__(self, tokenizer: Any, version: int = 0) -> None:
        super().__init__(tokenizer, [], version)
        self.gate = asyncio.Event()
        self.gate.set()

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        await self.gate.wait()
        self.turns = ["<answer> Shakespeare </answer>"]
        return await super().generate(request)


def _producer(engine: Any, redis: Any, **kw: Any) -> GroupProducer:
    args: dict[str, Any] = {
        "engine": engine,
        "searcher": FakeSearcher(),
        "tokenizer": engine.tokenizer,
        "prompts": endless(ROWS, shuffle=False, seed=0),
        "redis": redis,
        "metrics": RolloutMetrics(),
        "loop_settings": LoopSettings(max_turns=1, max_tokens_per_turn=16),
        "group_size": 3,
        "max_staleness": 1,
        "max_groups_in_flight": 2,
        "buffer_groups": 4,
        "version_poll_s": 0.02,
        "producer": "test",
        **kw,
    }
    return GroupProducer(**args)


async def _info(redis: Any, **kw: Any) -> None:
    """What the trainer writes on start; a wide capacity unless the test says otherwise."""
    fields: dict[str, Any] = {"run_id": DEFAULT_RUN_ID, "version": 0, "step": 0, "groups_per_step": 4,
                              "publish_every": 1, "staleness_k": 1, **kw}  # fmt: skip
    await redis.set(DEFAULT_KEYS.trainer_info, TrainerInfo(**fields).model_dump_json())


async def _until(cond: Any, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_groups_are_pushed_and_decode(tokenizer: Any) -> None:
    async def main() -> None:
        redis = fakeredis.aioredis.FakeRedis()
        await _info(redis, groups_per_step=2)
        prod = _producer(GatedEngine(tokenizer), redis)
        task = asyncio.create_task(prod.run())

        async def three() -> bool:
            return await redis.xlen(DEFAULT_KEYS.stream) >= 3

        await _until(three)
        task.cancel()
        entries = await redis.xrange(DEFAULT_KEYS.stream)
        groups = [decode_group(fields[b"group"]) for _, fields in entries]
        run = prod.producer_run
        assert [g.group_id for g in groups[:3]] == [
            f"world:0:0:{run}",
            f"world:1:0:{run}",
            f"world:0:1:{run}",
        ]
        g = groups[0]
        assert len(g.trajectories) == 3 and g.producer == "test" and g.gold_answers == ["Shakespeare"]
        assert all(x.run_id == DEFAULT_RUN_ID for x in groups)
        assert [t.sample_index for t in g.trajectories] == [0, 1, 2]
        assert all(t.reward == 1.0 and t.versions[0] == 0 for t in g.trajectories)

    asyncio.run(main())


def test_admission_waits_for_weights_within_k(tokenizer: Any) -> None:
    async def main() -> None:
        redis = fakeredis.aioredis.FakeRedis()
        await redis.set(DEFAULT_KEYS.trainer_version, 2)
        await _info(redis, version=2)
        engine = GatedEngine(tokenizer, version=0)
        prod = _producer(engine, redis)
        task = asyncio.create_task(prod.run())
        await asyncio.sleep(0.3)
        assert engine.requests == [] and await redis.xlen(DEFAULT_KEYS.stream) == 0
        engine._version = 1  # within K=1 of the trainer: admitted

        async def pushed() -> bool:
            return await redis.xlen(DEFAULT_KEYS.stream) >= 1

        await _until(pushed)
        task.cancel()
        (_, fields), *_ = await redis.xrange(DEFAULT_KEYS.stream)
        assert decode_group(fields[b"group"]).min_version == 1
        assert prod.metrics.admission_wait._value.get() > 0.2

    asyncio.run(main())


def test_too_stale_groups_are_dropped_and_counted(tokenizer: Any) -> None:
    async def main() -> None:
        redis = fakeredis.aioredis.FakeRedis()
        await _info(redis)
        engine = GatedEngine(tokenizer, version=0)
        engine.gate.clear()
        prod = _producer(engine, redis)
        task = asyncio.create_task(prod.run())

        async def in_flight() -> bool:
            return len(engine.requests) == 0 and prod.metrics.in_flight._value.get() == 6

        await _until(in_flight)
        await redis.set(DEFAULT_KEYS.trainer_version, 2)  # the two groups in flight are now 2 > K behind

        async def seen() -> bool:
            return prod.trainer_version == 2

        await _until(seen)
        engine.gate.set()

        async def dropped() -> bool:
            return prod.metrics.stale_drops._value.get() == 2

        await _until(dropped)
        await asyncio.sleep(0.1)
        task.cancel()
        assert await redis.xlen(DEFAULT_KEYS.stream) == 0
        assert prod.metrics.groups.labels(status="stale")._value.get() == 2
        assert len(engine.requests) == 6  # no new group started while the engine lags

    asyncio.run(main())


class FlakyRedis(fakeredis.aioredis.FakeRedis):
    down = True

    async def xadd(self, *a: Any, **kw: Any) -> Any:
        if self.down:
            raise RedisConnectionError("redis is down")
        return await super().xadd(*a, **kw)


def test_redis_outage_buffers_then_backpressures_and_loses_nothing(tokenizer: Any) -> None:
    async def main() -> None:
        redis = FlakyRedis()
        await _info(redis)
        engine = GatedEngine(tokenizer)
        prod = _producer(engine, redis, buffer_groups=2, max_groups_in_flight=1)
        task = asyncio.create_task(prod.run())
        await asyncio.sleep(0.5)
        # 1 group held by the retrying pusher + 2 buffered + 1 waiting to enter the buffer, then stop
        assert len(engine.requests) == 4 * 3
        assert prod.metrics.redis_errors._value.get() >= 1
        redis.down = False

        async def drained() -> bool:
            return prod.pushed >= 6

        await _until(drained)
        task.cancel()
        ids = [decode_group(f[b"group"]).group_id for _, f in await redis.xrange(DEFAULT_KEYS.stream)]
        run = prod.producer_run
        assert ids[:4] == [f"world:0:0:{run}", f"world:1:0:{run}", f"world:0:1:{run}", f"world:1:1:{run}"]

    asyncio.run(main())


def test_backpressure_stops_at_max_queued_groups(tokenizer: Any) -> None:
    """With nobody consuming, a replica stops starting groups once the stream holds the extra cap,
    well below the trainer's capacity (1 group per step, K = 10: 11 groups)."""

    async def main() -> None:
        redis = fakeredis.aioredis.FakeRedis()
        await _info(redis, groups_per_step=1, staleness_k=10)
        prod = _producer(GatedEngine(tokenizer), redis, max_queued_groups=2, max_staleness=10)
        task = asyncio.create_task(prod.run())

        async def two() -> bool:
            return await redis.xlen(DEFAULT_KEYS.stream) >= 2

        await _until(two)
        await asyncio.sleep(0.5)
        assert await redis.xlen(DEFAULT_KEYS.stream) == 2
        assert await prod.queued_groups() == 2
        # the trainer acknowledges both: production resumes
        await redis.xgroup_create(DEFAULT_KEYS.stream, "trainers", id="$")

        async def more() -> bool:
            return await redis.xlen(DEFAULT_KEYS.stream) >= 3

        await _until(more)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_group_ids_differ_across_producer_runs(tokenizer: Any) -> None:
    redis = fakeredis.aioredis.FakeRedis()
    a, b = _producer(GatedEngine(tokenizer), redis), _producer(GatedEngine(tokenizer), redis)
    assert a.producer_run != b.producer_run and a.producer_run.startswith("test-")


def test_a_failed_engine_starts_no_group_and_asks_for_a_whole_version(tokenizer: Any) -> None:
    """Issue 30: while a swap that failed mid-way leaves mixed weights, no group starts (not even a
    failing one: the prompts are not used up), and the catch-up (the service's verified swap path)
    is asked for the trainer's version, which heals the engine."""

    async def main() -> None:
        redis = fakeredis.aioredis.FakeRedis()
        await _info(redis)
        engine = GatedEngine(tokenizer, version=0)
        engine.mark_failed("weights update to version 1 failed mid-way")
        asked: list[int] = []

        async def catch_up(version: int) -> None:
            asked.append(version)
            engine._version, engine._failed = version, None  # a whole version loaded

        prod = _producer(engine, redis, catch_up=catch_up, catch_up_after_s=0.3)
        await redis.set(DEFAULT_KEYS.trainer_version, 1)
        task = asyncio.create_task(prod.run())
        await asyncio.sleep(0.2)
        assert engine.requests == [] and await redis.xlen(DEFAULT_KEYS.stream) == 0
        assert prod.last_admission is not None and prod.last_admission.reason == "engine_failed"

        async def pushed() -> bool:
            return await redis.xlen(DEFAULT_KEYS.stream) >= 1

        await _until(pushed)
        task.cancel()
        assert asked == [1]
        (_, fields), *_ = await redis.xrange(DEFAULT_KEYS.stream)
        assert decode_group(fields[b"group"]).min_version == 1

    asyncio.run(main())

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
from llds_rollout.dataset import DataOrder, PromptRow
from llds_rollout.engine.base import EngineError, GenerationRequest, GenerationResult
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
        "data": DataOrder(ROWS, shuffle=False, seed=0),
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
        # one id per position of the run's data order (position 2: row 0 of epoch 1)
        assert [g.group_id for g in groups[:3]] == ["world:0:0:p0", "world:1:0:p1", "world:0:1:p2"]
        assert int(await redis.get(DEFAULT_KEYS.data_cursor)) >= 3
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

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        # the push: the script that adds to the stream (claims still work, so groups get sampled)
        if self.down and DEFAULT_KEYS.stream in keys_and_args[:numkeys]:
            raise RedisConnectionError("redis is down")
        return await super().evalsha(sha, numkeys, *keys_and_args)


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
        assert ids[:4] == ["world:0:0:p0", "world:1:0:p1", "world:0:1:p2", "world:1:1:p3"]

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


def test_claim_owners_differ_across_producer_runs(tokenizer: Any) -> None:
    redis = fakeredis.aioredis.FakeRedis()
    a, b = _producer(GatedEngine(tokenizer), redis), _producer(GatedEngine(tokenizer), redis)
    assert a.producer_run != b.producer_run and a.producer_run.startswith("test-")
    assert a.cursor.owner == a.producer_run


def test_replicas_share_one_data_order_and_a_dead_ones_prompts_are_sampled_by_the_living(
    tokenizer: Any,
) -> None:
    """Two replicas walk one data order (no position twice, none skipped); one that dies with groups in
    flight (its task cancelled, nothing given back: a kill -9) leaves its positions claimed, and once
    their lease runs out the other samples them; what the dead one would push later is refused. A
    replica stopped gracefully gives its positions back at once."""

    async def main() -> None:
        redis = fakeredis.aioredis.FakeRedis()
        await _info(redis, groups_per_step=8, staleness_k=5)
        live = _producer(
            GatedEngine(tokenizer), redis, claim_lease_s=0.6, max_staleness=5, max_queued_groups=3
        )
        doomed_engine = GatedEngine(tokenizer)
        doomed = _producer(doomed_engine, redis, claim_lease_s=0.6, max_staleness=5, producer="doomed")
        doomed_engine.gate.clear()  # its groups never finish
        t_doomed = asyncio.create_task(doomed.run())

        async def claimed() -> bool:
            return len(doomed._claimed) == 2

        await _until(claimed)
        dead = sorted(doomed._claimed)
        doomed._give_back = _nothing  # type: ignore[method-assign]  # kill -9: no clean-up
        t_doomed.cancel()
        await asyncio.gather(t_doomed, return_exceptions=True)
        assert sorted(int(k) for k in await redis.hkeys(DEFAULT_KEYS.data_claims)) == dead
        t_live = asyncio.create_task(live.run())
        await asyncio.sleep(0.1)
        assert live.metrics.data_claims.labels(how="retaken")._value.get() == 0  # their lease still runs

        async def trainer() -> None:  # acknowledges what reaches the stream, as the trainer would
            await redis.xgroup_create(DEFAULT_KEYS.stream, "trainers", id="0", mkstream=True)
            # (ended by a flag, not cancelled: a cancel that lands inside a fakeredis call can be lost)
            while not done.is_set():
                for _, entries in await redis.xreadgroup("trainers", "t", {DEFAULT_KEYS.stream: ">"}):
                    for eid, _ in entries:
                        await redis.xack(DEFAULT_KEYS.stream, "trainers", eid)
                await asyncio.sleep(0.02)

        done = asyncio.Event()
        t_trainer = asyncio.create_task(trainer())

        async def six() -> bool:  # and the dead one's two, once their lease ran out
            ids = [decode_group(f[b"group"]).group_id for _, f in await redis.xrange(DEFAULT_KEYS.stream)]
            return len(ids) >= 6 and set(dead) <= {int(i.rsplit(":p", 1)[1]) for i in ids}

        await _until(six)
        live.stop()
        done.set()
        await asyncio.gather(t_live, t_trainer, return_exceptions=True)
        ids = [decode_group(f[b"group"]).group_id for _, f in await redis.xrange(DEFAULT_KEYS.stream)]
        positions = [int(i.rsplit(":p", 1)[1]) for i in ids]
        assert len(set(positions)) == len(positions)  # no position twice
        assert set(dead) <= set(positions)  # the dead replica's prompts were sampled after all
        assert live.metrics.data_claims.labels(how="retaken")._value.get() == 2
        # graceful stop: nothing left claimed, every position below the cursor is in the stream
        cursor = int(await redis.get(DEFAULT_KEYS.data_cursor))
        left = {int(k): v for k, v in (await redis.hgetall(DEFAULT_KEYS.data_claims)).items()}
        assert all(v == b"released\t0\t0" for v in left.values()), left  # given back, no attempt counted
        pushed_or_given = set(positions) | {int(k) for k in await redis.hkeys(DEFAULT_KEYS.data_claims)}
        assert pushed_or_given == set(range(cursor))
        # the dead one comes back with a group for a position now in the stream: refused
        assert await doomed.cursor.push(dead[0], "group", b"late") is None

    asyncio.run(main())


async def _nothing() -> None:
    return None


class FailingEngine(GatedEngine):
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        raise EngineError("the engine failed")


def test_a_failing_prompt_is_retried_then_dropped_on_the_record(tokenizer: Any) -> None:
    """A group that fails (engine errors) gives its position back for another attempt at once; the
    last allowed attempt records it in data:dropped (why=failed); the stream never gets it."""

    async def main() -> None:
        redis = fakeredis.aioredis.FakeRedis()
        await _info(redis)
        prod = _producer(FailingEngine(tokenizer), redis, max_attempts=2, max_groups_in_flight=1)
        task = asyncio.create_task(prod.run())

        async def dropped() -> bool:
            return await redis.xlen(DEFAULT_KEYS.data_dropped) >= 2

        await _until(dropped)
        prod.stop()
        await asyncio.gather(task, return_exceptions=True)
        rows = [
            {k.decode(): v.decode() for k, v in f.items()}
            for _, f in await redis.xrange(DEFAULT_KEYS.data_dropped)
        ]
        assert [(r["position"], r["why"], r["group_id"]) for r in rows[:2]] == [
            ("0", "failed", "world:0:0:p0"), ("1", "failed", "world:1:0:p1")]  # fmt: skip
        assert prod.metrics.data_claims.labels(how="retried")._value.get() >= 2
        assert prod.metrics.data_dropped.labels(why="failed")._value.get() >= 2
        assert await redis.xlen(DEFAULT_KEYS.stream) == 0

    asyncio.run(main())


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

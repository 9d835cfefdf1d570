"""Admission at the rollout: the capacity rule on hand-computed numbers, the shared in-flight count
across replicas (fakeredis), dead replicas, waiting without trainer info, and catch-up (producer and
service, on fakes).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import torch
from rollout_fakes import ScriptedEngine
from safetensors.torch import save_file
from test_rollout_scheduler import GatedEngine, _info, _producer, _until

from llds_proto.messages import TrainerInfo
from llds_proto.streams import DEFAULT_KEYS, DEFAULT_RUN_ID, TRAINER_GROUP, RunKeys
from llds_rollout.config import RolloutSettings, VLLMEngineSettings
from llds_rollout.scheduler import AdmissionInputs, decide
from llds_rollout.service import RolloutService
from llds_rollout.weights import write_marker


def info(**kw: Any) -> TrainerInfo:
    fields: dict[str, Any] = {"run_id": DEFAULT_RUN_ID, "version": 5, "step": 5, "groups_per_step": 2,
                              "publish_every": 1, "staleness_k": 1, **kw}  # fmt: skip
    return TrainerInfo(**fields)


def inputs(**kw: Any) -> AdmissionInputs:
    fields: dict[str, Any] = {"info": info(), "trainer_version": 5, "engine_version": 5, "oldest_in_flight": None,
                              "stream_unacked": 0, "in_flight": 0, **kw}  # fmt: skip
    return AdmissionInputs(**fields)


# ---------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("case", "x", "k", "max_queued", "admit", "reason", "capacity", "queued"),
    [
        # G/step = 2, one version per step, K = 1, engine current: 2 * (1 * 1 + 1) = 4
        ("fits exactly", inputs(stream_unacked=2, in_flight=1), 1, 0, True, "ok", 4, 2),
        ("one too many", inputs(stream_unacked=2, in_flight=2), 1, 0, False, "capacity", 4, 2),
        # trained but not yet acknowledged (acks wait for checkpoints): not queued work
        (
            "trained_unacked",
            inputs(info=info(trained_unacked=2), stream_unacked=4, in_flight=1),
            1,
            0,
            True,
            "ok",
            4,
            2,
        ),
        # engine one version behind: 2 * (0 * 1 + 1) = 2
        ("engine lag 1", inputs(engine_version=4, stream_unacked=1), 1, 0, True, "ok", 2, 1),
        ("engine lag 1 full", inputs(engine_version=4, stream_unacked=2), 1, 0, False, "capacity", 2, 2),
        # more than K behind: nothing can be trained in time, whatever the queue
        ("behind", inputs(engine_version=3), 1, 0, False, "behind", 0, 0),
        # a group in flight that started a version ago limits what may overtake it: 2 * (0 + 1) = 2
        ("old group in flight", inputs(oldest_in_flight=4, in_flight=2), 1, 0, False, "capacity", 2, 0),
        # publish every 3 steps, K = 2, lag 1: 2 * (1 * 3 + 1) = 8
        (
            "publish_every 3",
            inputs(
                info=info(publish_every=3, staleness_k=2), engine_version=4, stream_unacked=5, in_flight=2
            ),
            2,
            0,
            True,
            "ok",
            8,
            5,
        ),
        # the smaller K wins: the rollout's 3 against the trainer's 1 -> 4
        ("trainer's K", inputs(stream_unacked=4), 3, 0, False, "capacity", 4, 4),
        ("rollout's K", inputs(info=info(staleness_k=3), stream_unacked=4), 1, 0, False, "capacity", 4, 4),
        # the extra cap, and never below one trainer step
        ("max_queued", inputs(info=info(staleness_k=5), stream_unacked=2), 5, 2, False, "max_queued", 12, 2),
        ("max_queued below a step", inputs(stream_unacked=1), 1, 1, True, "ok", 4, 1),
        # the version key ahead of the info (published, info not yet rewritten): lag from the key
        (
            "version key ahead of info",
            inputs(trainer_version=6, engine_version=6, stream_unacked=2),
            1,
            0,
            True,
            "ok",
            4,
            2,
        ),
        # the info ahead of the key (acknowledged with its info, not yet published): lag from the info
        ("info ahead of key", inputs(info=info(version=6), stream_unacked=2), 1, 0, False, "capacity", 2, 2),
        ("info ahead of key fits", inputs(info=info(version=6), stream_unacked=1), 1, 0, True, "ok", 2, 1),
        ("no trainer info", inputs(info=None, stream_unacked=0), 1, 0, False, "no_trainer_info", 0, 0),
    ],
)
def test_admission_rule(
    case: str,
    x: AdmissionInputs,
    k: int,
    max_queued: int,
    admit: bool,
    reason: str,
    capacity: int,
    queued: int,
) -> None:
    d = decide(x, max_staleness=k, max_queued_groups=max_queued)
    assert (d.admit, d.reason, d.capacity, d.queued) == (admit, reason, capacity, queued), case


def test_capacity_keeps_the_last_group_within_k() -> None:
    """Simulate the trainer draining a full queue: the last admitted group is trained in time."""
    for gps in (1, 2, 3):
        for pe in (1, 2, 3):
            for k in (0, 1, 2):
                for lag in range(k + 1):
                    t = info(groups_per_step=gps, publish_every=pe, staleness_k=k)
                    cap = t.capacity(lag)
                    # worst phase: a publish after the first step; the group is at position cap
                    steps_before = -(-cap // gps) - 1
                    publishes = -(-steps_before // pe)
                    assert lag + publishes <= k, (gps, pe, k, lag)
                    # one more would not be
                    steps_one_more = -(-(cap + 1) // gps) - 1
                    assert lag + -(-steps_one_more // pe) > k, (gps, pe, k, lag)


# ---------------------------------------------------------------------------- in Redis


def test_queue_depth_counts_lag_and_pending(tokenizer: Any) -> None:
    async def main() -> None:
        redis = fakeredis.aioredis.FakeRedis()
        prod = _producer(GatedEngine(tokenizer), redis)
        assert await prod.queued_groups() == 0  # no stream yet
        for _ in range(5):
            await redis.xadd(DEFAULT_KEYS.stream, {b"group": b"x"})
        assert await prod.queued_groups() == 5  # no consumer group yet: everything is queued
        await redis.xgroup_create(DEFAULT_KEYS.stream, TRAINER_GROUP, id="0")
        got = await redis.xreadgroup(TRAINER_GROUP, "t", {DEFAULT_KEYS.stream: ">"}, count=3)
        ids = [eid for eid, _ in got[0][1]]
        assert await prod.queued_groups() == 5  # 2 undelivered + 3 pending
        await redis.xack(DEFAULT_KEYS.stream, TRAINER_GROUP, *ids[:2])
        assert await prod.queued_groups() == 3

    asyncio.run(main())


def test_two_replicas_never_exceed_the_shared_capacity(tokenizer: Any) -> None:
    """Two producers on one Redis, each free to run 3 groups: together they hold at most capacity
    (1 group per step, K = 1: 2), and each sees the other's count."""

    async def main() -> None:
        server = fakeredis.FakeServer()
        ra, rb = (fakeredis.aioredis.FakeRedis(server=server) for _ in range(2))
        await _info(ra, groups_per_step=1)
        ea, eb = GatedEngine(tokenizer), GatedEngine(tokenizer)
        ea.gate.clear()
        eb.gate.clear()
        a = _producer(ea, ra, producer="a", max_groups_in_flight=3)
        b = _producer(eb, rb, producer="b", max_groups_in_flight=3)
        tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]

        async def full() -> bool:
            return len(a._held) + len(b._held) == 2

        await _until(full)
        await asyncio.sleep(0.5)
        assert len(a._held) + len(b._held) == 2
        assert a.last_admission is not None and a.last_admission.reason == "capacity"
        entries = {k.decode(): json.loads(v) for k, v in (await ra.hgetall(DEFAULT_KEYS.in_flight)).items()}
        assert {n: e["groups"] for n, e in entries.items()} == {"a": len(a._held), "b": len(b._held)}
        assert a.metrics.groups_in_flight._value.get() == 2
        # nobody consumes: the two pushed groups keep the queue full
        ea.gate.set()
        eb.gate.set()

        async def pushed() -> bool:
            return await ra.xlen(DEFAULT_KEYS.stream) == 2

        await _until(pushed)
        await asyncio.sleep(0.5)
        assert await ra.xlen(DEFAULT_KEYS.stream) == 2 and not a._held and not b._held
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await a.clear_in_flight()
        assert await ra.hkeys(DEFAULT_KEYS.in_flight) == [b"b"]

    asyncio.run(main())


def test_a_dead_replicas_count_expires(tokenizer: Any) -> None:
    async def main() -> None:
        redis = fakeredis.aioredis.FakeRedis()
        await _info(redis, groups_per_step=1)  # capacity 2
        sec, usec = await redis.time()
        entry = {"groups": 2, "deciding": 0, "oldest_version": 0, "at": sec + usec / 1e6}
        await redis.hset(DEFAULT_KEYS.in_flight, "ghost", json.dumps(entry))
        engine = GatedEngine(tokenizer)
        prod = _producer(engine, redis, in_flight_ttl_s=1.5)
        task = asyncio.create_task(prod.run())
        await asyncio.sleep(0.3)
        assert engine.requests == []  # the ghost's fresh count fills the capacity
        assert prod.last_admission is not None and prod.last_admission.reason == "capacity"

        async def started() -> bool:
            return len(engine.requests) > 0

        await _until(started, timeout_s=5)  # its entry is older than the TTL: ignored
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_no_trainer_info_waits_and_says_so_once(tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        redis = fakeredis.aioredis.FakeRedis()
        engine = GatedEngine(tokenizer)
        prod = _producer(engine, redis)
        with caplog.at_level(logging.INFO, logger="llds_rollout.scheduler"):
            task = asyncio.create_task(prod.run())
            await asyncio.sleep(0.5)
            assert engine.requests == []
            await _info(redis)

            async def pushed() -> bool:
                return await redis.xlen(DEFAULT_KEYS.stream) >= 1

            await _until(pushed)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        waits = [r.getMessage() for r in caplog.records if "no_trainer_info" in r.getMessage()]
        assert len(waits) == 1 and DEFAULT_KEYS.trainer_info in waits[0]
        assert prod.metrics.admission_wait._value.get() > 0.4

    asyncio.run(main())


def test_admission_catches_up_when_more_than_k_behind(tokenizer: Any) -> None:
    """No notice comes: after catch_up_after_s the producer asks for the newest version itself."""

    async def main() -> None:
        redis = fakeredis.aioredis.FakeRedis()
        await redis.set(DEFAULT_KEYS.trainer_version, 3)
        await _info(redis, version=3)
        engine = GatedEngine(tokenizer, version=0)
        asked: list[int] = []

        async def catch_up(version: int) -> None:
            asked.append(version)
            engine._version = version

        prod = _producer(engine, redis, catch_up=catch_up, catch_up_after_s=0.2)
        task = asyncio.create_task(prod.run())

        async def pushed() -> bool:
            return await redis.xlen(DEFAULT_KEYS.stream) >= 1

        await _until(pushed)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert asked == [3]
        (_, fields), *_ = await redis.xrange(DEFAULT_KEYS.stream)
        from llds_proto.codec import decode_group

        assert decode_group(fields[b"group"]).min_version == 3

    asyncio.run(main())


def test_keys_follow_the_run_id(tokenizer: Any) -> None:
    async def main() -> None:
        redis = fakeredis.aioredis.FakeRedis()
        keys = RunKeys("exp-7")
        await redis.set(keys.trainer_info, info(run_id="exp-7", version=0).model_dump_json())
        prod = _producer(GatedEngine(tokenizer), redis, keys=keys)
        task = asyncio.create_task(prod.run())

        async def pushed() -> bool:
            return await redis.xlen(keys.stream) >= 1

        await _until(pushed)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        from llds_proto.codec import decode_group

        (_, fields), *_ = await redis.xrange(keys.stream)
        assert decode_group(fields[b"group"]).run_id == "exp-7"
        assert await redis.exists(DEFAULT_KEYS.stream) == 0
        assert await redis.hexists(keys.in_flight, "test")

    asyncio.run(main())


def test_run_id_is_validated() -> None:
    assert RolloutSettings(train=False, run_id="exp-7").run_id == "exp-7"
    with pytest.raises(ValueError, match="run id"):
        RolloutSettings(train=False, run_id="no spaces")


# ---------------------------------------------------------------------------- catch-up in the service


def _publish_fake(root: Path, version: int) -> Path:
    folder = root / f"v{version:06d}"
    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
    write_marker(folder, version, step=version)
    return folder


def _service(tokenizer: Any, tmp_path: Path, **over: Any) -> tuple[RolloutService, ScriptedEngine]:
    settings = RolloutSettings(train=False, weights_root=tmp_path, **over)
    engine = ScriptedEngine(tokenizer, [])
    return RolloutService(settings, engine=engine), engine


def test_service_catch_up_loads_the_published_folder(tokenizer: Any, tmp_path: Path) -> None:
    async def main() -> None:
        svc, engine = _service(tokenizer, tmp_path)
        _publish_fake(tmp_path, 2)
        await svc.catch_up(2)
        assert engine.version == 2 and svc.metrics.catch_ups.labels(status="ok")._value.get() == 1
        await svc.catch_up(2)  # not newer: nothing to do, nothing counted
        assert svc.metrics.catch_ups.labels(status="ok")._value.get() == 1
        # a corrupt folder: refused, the old weights keep serving
        bad = _publish_fake(tmp_path, 3)
        (bad / "model.safetensors").write_bytes(b"garbage")
        await svc.catch_up(3)
        assert engine.version == 2 and svc.metrics.catch_ups.labels(status="failed")._value.get() == 1
        await svc.catch_up(4)  # not published at all
        assert engine.version == 2 and svc.metrics.catch_ups.labels(status="failed")._value.get() == 2

    asyncio.run(main())


def test_service_catches_up_at_start_from_the_version_key(tokenizer: Any, tmp_path: Path) -> None:
    async def main() -> None:
        svc, engine = _service(tokenizer, tmp_path, run_id="r1")
        _publish_fake(tmp_path, 4)
        svc.redis = fakeredis.aioredis.FakeRedis()
        await svc._catch_up_on_start()  # no version yet: nothing
        assert engine.version == 0
        await svc.redis.set(RunKeys("r1").trainer_version, 4)
        await svc._catch_up_on_start()
        assert engine.version == 4

    asyncio.run(main())


def test_nccl_replicas_wait_for_the_broadcast(tokenizer: Any, tmp_path: Path) -> None:
    async def main() -> None:
        engine_settings = VLLMEngineSettings(weight_transfer="nccl", device="cuda")
        svc, engine = _service(tokenizer, tmp_path, engine=engine_settings)
        _publish_fake(tmp_path, 1)
        await svc.catch_up(1)
        assert engine.version == 0

    asyncio.run(main())

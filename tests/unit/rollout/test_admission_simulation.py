"""Admission against a simulated trainer, over many steps with random timings (fakeredis).

The producer is the real one; the trainer is a faithful miniature of the trainer service's loop:
read ``groups_per_step`` entries, drop those more than K versions behind, "train", bump the version,
XACK and write its info in one MULTI/EXEC, publish (version key), then let the engine swap after a
random delay (requests that started before the swap keep the old version, as on vLLM). Group and
step durations are random, so groups finish out of order and the engine often lags the trainer.

Admission promises that every group it lets start can be trained within K: no group is dropped as
stale at either end. Each case runs long enough (tens of steps) that an off-by-one in the capacity
rule shows up as drops.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import pytest
from test_rollout_scheduler import ROWS, GatedEngine

from llds_proto.codec import decode_group
from llds_proto.messages import TrainerInfo
from llds_proto.streams import DEFAULT_KEYS, DEFAULT_RUN_ID, GROUP_FIELD, TRAINER_GROUP
from llds_rollout.agent import LoopSettings
from llds_rollout.dataset import DataOrder
from llds_rollout.engine.base import GenerationRequest, GenerationResult
from llds_rollout.metrics import RolloutMetrics
from llds_rollout.scheduler import GroupProducer

KEYS = DEFAULT_KEYS


class RandomEngine(GatedEngine):
    """Each turn takes a random time; the version is the one serving when the request started."""

    def __init__(self, tokenizer: Any, rng: random.Random, turn_s: tuple[float, float]) -> None:
        super().__init__(tokenizer)
        self.rng = rng
        self.turn_s = turn_s

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        version = self._version
        await asyncio.sleep(self.rng.uniform(*self.turn_s))
        self.turns = ["<answer> Shakespeare </answer>"]
        res = await super().generate(request)
        return GenerationResult(res.token_ids, res.logprobs, version, res.finish_reason, res.stop_str)


@dataclass
class Trained:
    steps: int = 0
    distances: list[int] = field(default_factory=list)
    stale: int = 0


async def trainer(
    redis: Any,
    engine: RandomEngine,
    rng: random.Random,
    *,
    steps: int,
    groups_per_step: int,
    k: int,
    step_s: tuple[float, float],
    swap_s: tuple[float, float],
) -> Trained:
    out = Trained()
    version = 0

    def info() -> str:
        return TrainerInfo(run_id=DEFAULT_RUN_ID, version=version, step=out.steps,
                           groups_per_step=groups_per_step, publish_every=1, staleness_k=k).model_dump_json()  # fmt: skip

    await redis.xgroup_create(KEYS.stream, TRAINER_GROUP, id="0", mkstream=True)
    await redis.set(KEYS.trainer_info, info())
    swaps: list[asyncio.Task[None]] = []

    async def swap(v: int) -> None:
        await asyncio.sleep(rng.uniform(*swap_s))
        engine._version = max(engine._version, v)

    while out.steps < steps:
        batch: list[bytes] = []
        while len(batch) < groups_per_step:
            got = await redis.xreadgroup(
                TRAINER_GROUP, "t", {KEYS.stream: ">"}, count=groups_per_step - len(batch)
            )
            for _, entries in got or []:
                for eid, fields in entries:
                    g = decode_group(fields[GROUP_FIELD])
                    if version - g.min_version > k:
                        out.stale += 1
                        await redis.xack(KEYS.stream, TRAINER_GROUP, eid)
                        continue
                    out.distances.append(version - g.min_version)
                    batch.append(eid)
            if not got:
                await asyncio.sleep(0.002)
        await asyncio.sleep(rng.uniform(*step_s))  # the update
        version += 1
        out.steps += 1
        async with redis.pipeline(transaction=True) as pipe:
            pipe.xack(KEYS.stream, TRAINER_GROUP, *batch)
            pipe.set(KEYS.trainer_info, info())
            await pipe.execute()
        await redis.set(KEYS.trainer_version, str(version))
        swaps.append(asyncio.create_task(swap(version)))
    await asyncio.gather(*swaps)
    return out


CASES = [
    # groups_per_step, K, groups in flight, turn (s), step (s), swap (s)
    pytest.param(1, 1, 2, (0.002, 0.02), (0.001, 0.01), (0.0, 0.02), id="tiny-preset-fast-trainer"),
    pytest.param(2, 1, 2, (0.005, 0.03), (0.01, 0.03), (0.0, 0.03), id="cpu-preset"),
    pytest.param(2, 1, 8, (0.002, 0.05), (0.005, 0.02), (0.0, 0.04), id="many-in-flight-slow-swaps"),
    pytest.param(4, 2, 6, (0.002, 0.04), (0.002, 0.02), (0.0, 0.05), id="k2"),
    pytest.param(3, 0, 4, (0.002, 0.02), (0.002, 0.01), (0.0, 0.01), id="on-policy-k0"),
]


@pytest.mark.parametrize(("gps", "k", "in_flight", "turn_s", "step_s", "swap_s"), CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_admitted_groups_are_never_stale(
    tokenizer: Any, gps: int, k: int, in_flight: int, turn_s: Any, step_s: Any, swap_s: Any, seed: int
) -> None:
    async def main() -> tuple[Trained, GroupProducer]:
        rng = random.Random(seed)
        redis = fakeredis.aioredis.FakeRedis()
        engine = RandomEngine(tokenizer, rng, turn_s)
        prod = GroupProducer(
            engine=engine, searcher=_Searcher(), tokenizer=tokenizer, data=DataOrder(ROWS, shuffle=False, seed=0),
            redis=redis, metrics=RolloutMetrics(), loop_settings=LoopSettings(max_turns=1, max_tokens_per_turn=8),
            group_size=2, max_staleness=k, max_groups_in_flight=in_flight, buffer_groups=8, version_poll_s=0.005,
            producer="sim",
        )  # fmt: skip
        t = asyncio.create_task(trainer(redis, engine, rng, steps=40, groups_per_step=gps, k=k,
                                        step_s=step_s, swap_s=swap_s))  # fmt: skip
        await asyncio.sleep(0)
        run = asyncio.create_task(prod.run())
        try:
            result = await asyncio.wait_for(t, 120)
        finally:
            prod.stop()
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        return result, prod

    trained, prod = asyncio.run(main())
    assert trained.steps == 40
    assert max(trained.distances) <= k
    rollout_drops = prod.metrics.stale_drops._value.get()
    assert (trained.stale, rollout_drops) == (0, 0), (
        f"stale drops: trainer {trained.stale}, rollout {rollout_drops}"
    )


class _Searcher:
    async def search(self, query: str, request_id: str | None = None) -> list[Any]:
        return []

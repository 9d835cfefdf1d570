"""Continuous production of trajectory groups (issue 4 "Asynchrony" and "Staleness bound").

Prompts are drawn from the dataset forever; each becomes a group of G trajectories that advance on
their own (generate, retrieve, generate) while many groups are in flight. A group is pushed to Redis
when its G samples finish. Admission control: no new group starts while the engine is more than K
versions behind the trainer; a finished group whose oldest token is more than K versions behind is
dropped and counted. Failed trajectories fail their group, which is counted and never pushed. When
Redis is down, finished groups wait in a bounded buffer; when that is full, sampling waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from llds_proto.codec import encode_group
from llds_proto.messages import TrajectoryGroup
from llds_proto.search_protocol import prompt_ids
from llds_proto.streams import DEFAULT_KEYS, GROUP_FIELD, TRAINER_GROUP
from llds_rollout.agent import LoopSettings, Searcher, run_episode
from llds_rollout.dataset import PromptRow
from llds_rollout.engine.base import Engine, EngineError
from llds_rollout.metrics import RolloutMetrics
from llds_rollout.retrieval import RetrieverError

log = logging.getLogger("llds_rollout.scheduler")


def _raise_if_cancelling() -> None:
    """Re-raise a cancellation that a client library swallowed (redis clients can, mid-command),
    so that a cancelled loop really stops instead of waiting forever on its next item."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class GroupProducer:
    """Samples groups continuously until :meth:`stop`; one instance per rollout replica."""

    def __init__(
        self,
        *,
        engine: Engine,
        searcher: Searcher,
        tokenizer: Any,
        prompts: Iterator[tuple[PromptRow, int]],
        redis: aioredis.Redis,
        metrics: RolloutMetrics,
        loop_settings: LoopSettings,
        group_size: int,
        max_staleness: int,
        max_groups_in_flight: int,
        buffer_groups: int,
        max_queued_groups: int = 0,
        version_poll_s: float,
        producer: str,
    ) -> None:
        self.engine = engine
        self.searcher = searcher
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.redis = redis
        self.metrics = metrics
        self.loop_settings = loop_settings
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.version_poll_s = version_poll_s
        self.producer = producer
        self.max_queued_groups = max_queued_groups
        # Group ids must stay unique when a replica restarts and replays its epochs from the start:
        # the trainer treats a repeated id as a redelivery and drops it.
        self.run_id = f"{producer or 'rollout'}-{time.time_ns():x}"
        self.trainer_version = 0
        self.pushed = 0
        self._slots = asyncio.Semaphore(max_groups_in_flight)
        self._buffer: asyncio.Queue[TrajectoryGroup] = asyncio.Queue(maxsize=buffer_groups)
        self._running = asyncio.Event()
        self._running.set()
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.error: BaseException | None = None
        """An unexpected failure of a group task (a bug); it stops production and shows in /health."""

    # ------------------------------------------------------------------ control

    def pause(self) -> None:
        """Start no new groups; groups in flight finish."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    async def run(self) -> None:
        """Produce until stopped (cancel the task or call :meth:`stop`)."""
        aux = [asyncio.create_task(self._poll_version()), asyncio.create_task(self._pusher())]
        try:
            await self._read_version()
            while not self._stopping:
                await self._slots.acquire()
                # Checked after a slot frees up, not before: the trainer may have moved meanwhile.
                await self._running.wait()
                await self._admit()
                if self._stopping:
                    self._slots.release()
                    break
                row, epoch = next(self.prompts)
                task = asyncio.create_task(self._group(row, epoch))
                self._tasks.add(task)
                task.add_done_callback(self._group_done)
            if self.error is not None:
                raise self.error
        finally:
            for t in [*self._tasks, *aux]:
                t.cancel()
            await asyncio.gather(*self._tasks, *aux, return_exceptions=True)

    def _group_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self.error is None:
            self.error = task.exception()
            log.error("group task crashed; stopping production", exc_info=self.error)
            self.stop()

    def stop(self) -> None:
        self._stopping = True
        self._running.set()

    # ------------------------------------------------------------------ staleness

    def lag(self) -> int:
        """Versions the engine is behind the trainer."""
        return self.trainer_version - self.engine.version

    async def queued_groups(self) -> int:
        """Groups in the stream the trainer has not acknowledged (undelivered + pending)."""
        try:
            for g in await self.redis.xinfo_groups(DEFAULT_KEYS.stream):
                name = g.get("name")
                if name in (TRAINER_GROUP, TRAINER_GROUP.encode()):
                    lag = g.get("lag")
                    if lag is None:  # Redis cannot tell after deletions: count conservatively
                        return int(await self.redis.xlen(DEFAULT_KEYS.stream))
                    return int(lag) + int(g.get("pending", 0))
            return int(await self.redis.xlen(DEFAULT_KEYS.stream))
        except RedisError as e:
            if "no such key" in str(e).lower():
                return 0
            self.metrics.redis_errors.inc()
            log.warning("reading queue depth failed: %s", e)
            return 0

    def _queue_full(self, queued: int) -> bool:
        return bool(self.max_queued_groups) and queued + len(self._tasks) >= self.max_queued_groups

    async def _admit(self) -> None:
        t0 = time.perf_counter()
        waited = False
        while not self._stopping:
            behind = self.lag() > self.max_staleness
            queued = await self.queued_groups() if self.max_queued_groups else 0
            self.metrics.queued_groups.set(queued)
            if not behind and not self._queue_full(queued):
                break
            if not waited:
                log.info(
                    "admission waiting engine=%d trainer=%d k=%d queued=%d max_queued=%d",
                    self.engine.version,
                    self.trainer_version,
                    self.max_staleness,
                    queued,
                    self.max_queued_groups,
                )
                waited = True
            await asyncio.sleep(min(self.version_poll_s, 0.25))
        if waited:
            self.metrics.admission_wait.inc(time.perf_counter() - t0)

    async def _read_version(self) -> None:
        try:
            raw = await self.redis.get(DEFAULT_KEYS.trainer_version)
        except RedisError as e:
            self.metrics.redis_errors.inc()
            log.warning("reading trainer version failed: %s", e)
            return
        if raw is not None:
            self.trainer_version = max(self.trainer_version, int(raw))
            self.metrics.trainer_version.set(self.trainer_version)

    async def _poll_version(self) -> None:
        while True:
            _raise_if_cancelling()
            await asyncio.sleep(self.version_poll_s)
            await self._read_version()

    def is_stale(self, group: TrajectoryGroup) -> bool:
        """True if the group's oldest sampled token is more than K versions behind the trainer."""
        return self.trainer_version - group.min_version > self.max_staleness

    # ------------------------------------------------------------------ groups

    async def _group(self, row: PromptRow, epoch: int) -> None:
        group_id = f"{row.prompt_id}:{epoch}:{self.run_id}"
        try:
            prompt = prompt_ids(self.tokenizer, row.question)
            self.metrics.in_flight.inc(self.group_size)
            try:
                results = await asyncio.gather(
                    *[
                        run_episode(
                            self.engine,
                            self.searcher,
                            self.tokenizer,
                            row.question,
                            row.golds,
                            self.loop_settings,
                            trajectory_id=f"{group_id}/{i}",
                            sample_index=i,
                            prompt=prompt,
                        )
                        for i in range(self.group_size)
                    ],
                    return_exceptions=True,
                )
            finally:
                self.metrics.in_flight.dec(self.group_size)
            errors = [r for r in results if isinstance(r, BaseException)]
            for r in results:
                if not isinstance(r, BaseException):
                    self.metrics.observe_episode(r, "train")
            if errors:
                for e in errors:
                    if not isinstance(e, (RetrieverError, EngineError)):
                        raise e
                self.metrics.trajectories.labels(status="failed").inc(len(errors))
                self.metrics.groups.labels(status="failed").inc()
                log.warning("group failed group_id=%s failed=%d cause=%s", group_id, len(errors), errors[0])
                return
            group = TrajectoryGroup(
                group_id=group_id,
                prompt_id=row.prompt_id,
                question=row.question,
                gold_answers=row.golds,
                trajectories=[r.trajectory for r in results],  # type: ignore[union-attr]
                created_at=time.time(),
                producer=self.producer,
            )
            if self.is_stale(group):
                self._drop(group)
                return
            # Waiting here holds the group's slot: a full buffer stops new groups (backpressure).
            await self._buffer.put(group)
            self.metrics.buffer.set(self._buffer.qsize())
        finally:
            self._slots.release()

    def _drop(self, group: TrajectoryGroup) -> None:
        self.metrics.stale_drops.inc()
        self.metrics.groups.labels(status="stale").inc()
        log.info(
            "stale group dropped group_id=%s min_version=%d trainer=%d k=%d",
            group.group_id,
            group.min_version,
            self.trainer_version,
            self.max_staleness,
        )

    async def _pusher(self) -> None:
        while True:
            _raise_if_cancelling()
            group = await self._buffer.get()
            if self.is_stale(group):
                self._drop(group)
                self.metrics.buffer.set(self._buffer.qsize())
                continue
            data = encode_group(group)
            delay = 0.1
            while True:
                try:
                    await self.redis.xadd(DEFAULT_KEYS.stream, {GROUP_FIELD: data})
                    break
                except RedisError as e:
                    self.metrics.redis_errors.inc()
                    log.warning("push failed group_id=%s retry_in=%.1fs cause=%s", group.group_id, delay, e)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
            self.pushed += 1
            self.metrics.groups.labels(status="pushed").inc()
            self.metrics.buffer.set(self._buffer.qsize())
            rewards = [t.reward for t in group.trajectories]
            log.info(
                "group pushed group_id=%s min_version=%d reward_mean=%.3f bytes=%d",
                group.group_id,
                group.min_version,
                sum(rewards) / len(rewards),
                len(data),
            )

"""Continuous production of trajectory groups (issue 4 "Asynchrony" and "Staleness bound", issue 13
"Staleness at admission").

Prompts are drawn from the dataset forever; each becomes a group of G trajectories that advance on
their own (generate, retrieve, generate) while many groups are in flight. A group is pushed to Redis
when its G samples finish. Admission control (:func:`decide`): a group starts only if the trainer
will train it within K versions, given how many groups are queued for it and in flight on every
replica and how fast it consumes them (:class:`TrainerInfo`); a finished group whose oldest token is
more than K versions behind is still dropped and counted, as the exception. Failed trajectories fail
their group, which is counted and never pushed. When Redis is down, finished groups wait in a
bounded buffer; when that is full, sampling waits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.exceptions import RedisError

from llds_proto.codec import encode_group
from llds_proto.messages import TrainerInfo, TrajectoryGroup
from llds_proto.search_protocol import prompt_ids
from llds_proto.streams import DEFAULT_KEYS, GROUP_FIELD, TRAINER_GROUP, RunKeys
from llds_rollout.agent import LoopSettings, Searcher, run_episode
from llds_rollout.cursor import Claim, DataCursor
from llds_rollout.dataset import DataOrder, PromptRow
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


# ---------------------------------------------------------------------------- admission rule


@dataclass(frozen=True)
class AdmissionInputs:
    """What one admission decision reads (Redis, all replicas, this engine)."""

    info: TrainerInfo | None
    """The trainer's pace; None until the trainer has written it."""
    trainer_version: int
    """Newest version the trainer has (the version key or ``info.version``, whichever is newer)."""
    engine_version: int
    """Version this replica's engine serves."""
    oldest_in_flight: int | None
    """Lowest engine version any group in flight (any replica) started on; None if none is."""
    stream_unacked: int
    """Entries the trainer has not acknowledged: consumer-group lag + pending."""
    in_flight: int
    """Groups started and not yet in the stream, on every live replica (this one included)."""


@dataclass(frozen=True)
class Admission:
    """One decision of :func:`decide`."""

    admit: bool
    reason: str
    """``ok``, ``no_trainer_info``, ``behind`` (engine more than K versions behind), ``capacity``
    (the trainer could not train one more group in time), ``max_queued`` (the extra cap),
    ``redis_error`` or ``engine_failed`` (a swap failed mid-way: no whole version serving)."""
    capacity: int
    """Groups the trainer can take (queued + in flight, new one included); 0 without trainer info."""
    queued: int
    """Groups queued for the trainer: unacknowledged entries less those it trained already."""
    in_flight: int
    """Groups in flight on every replica before this decision."""
    lag: int
    """Versions the oldest group that the new one could overtake is behind the trainer."""


@dataclass(frozen=True)
class RedisView:
    """Everything an admission decision reads from Redis, taken in one MULTI/EXEC.

    Read one command at a time, a decision could pair the trainer's info from before a step with the
    queue from after it (the trainer acknowledges and writes its info atomically, so only a torn read
    can see one without the other).
    """

    version_key: int | None
    """The trainer's version key; None if unset or unreadable."""
    info: TrainerInfo | None
    unacked: int
    """Stream entries the trainer has not acknowledged (consumer-group lag + pending)."""
    acked: int | None
    """Entries the trainer's group has acknowledged ever; None when Redis cannot tell."""
    in_flight: dict[str, bytes]
    """Every replica's in-flight entry (``RunKeys.in_flight``)."""
    now: float
    """Redis's clock at the read."""


def stream_counts(groups: Any, xlen: int) -> tuple[int, int | None]:
    """(entries not acknowledged, entries acknowledged ever or None) from XINFO GROUPS and XLEN.

    ``groups`` is None when the stream does not exist yet.
    """
    if groups is None:
        return 0, 0
    for g in groups:
        if g.get("name") in (TRAINER_GROUP, TRAINER_GROUP.encode()):
            pending = int(g.get("pending", 0))
            read = g.get("entries-read")
            if read is None and g.get("last-delivered-id") in (b"0-0", "0-0"):
                read = 0  # nothing read yet
            acked = None if read is None else int(read) - pending
            lag = g.get("lag")
            if lag is None:  # Redis cannot tell after deletions: count conservatively
                return xlen, acked
            return int(lag) + pending, acked
    return xlen, 0  # no trainer has read yet: all queued


def _parse_info(raw: bytes | None, key: str) -> TrainerInfo | None:
    if raw is None:
        return None
    try:
        return TrainerInfo.model_validate_json(raw)
    except ValidationError as e:
        log.warning("unreadable trainer info at %s: %s", key, e)
        return None


async def read_view(redis: aioredis.Redis, keys: RunKeys) -> RedisView:
    """One atomic read (MULTI/EXEC) of the trainer's state, the stream and every replica's in-flight
    entry. Raises :class:`RedisError` when Redis cannot answer; no stream yet is an empty queue."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.get(keys.trainer_version)
        pipe.get(keys.trainer_info)
        pipe.xinfo_groups(keys.stream)
        pipe.xlen(keys.stream)
        pipe.hgetall(keys.in_flight)
        pipe.time()
        version_raw, info_raw, groups, xlen, in_flight, clock = await pipe.execute(raise_on_error=False)
    for r in (version_raw, info_raw, xlen, in_flight, clock):
        if isinstance(r, Exception):
            raise r
    if isinstance(groups, Exception):
        if "no such key" not in str(groups).lower():
            raise groups
        groups = None
    version: int | None = None
    if version_raw is not None:
        try:
            version = int(version_raw)
        except ValueError:
            log.warning("unreadable trainer version at %s: %r", keys.trainer_version, version_raw)
    unacked, acked = stream_counts(groups, int(xlen))
    sec, usec = clock
    return RedisView(
        version_key=version,
        info=_parse_info(info_raw, keys.trainer_info),
        unacked=unacked,
        acked=acked,
        in_flight={(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in in_flight.items()},
        now=sec + usec / 1e6,
    )


def decide(x: AdmissionInputs, *, max_staleness: int, max_queued_groups: int) -> Admission:
    """Admit a new group iff ``queued + in_flight + 1 <= info.capacity(lag)``.

    ``lag`` counts from the oldest group in flight, not only from the engine: a new group may finish
    first and be queued ahead of it, so each group in flight must still fit its own budget. K is the
    smaller of the rollout's and the trainer's. The trainer acknowledges a step's entries and writes
    the info naming its new version in one MULTI/EXEC, and :func:`read_view` reads both in one, so the
    queue never looks shorter than the version says. ``max_queued_groups`` caps further, never below
    one trainer step (the trainer would wait forever for a step that admission holds back).
    """
    info = x.info
    queued = max(0, x.stream_unacked - (info.trained_unacked if info is not None else 0))
    if info is None:
        return Admission(
            False, "no_trainer_info", 0, queued, x.in_flight, x.trainer_version - x.engine_version
        )
    k = min(max_staleness, info.staleness_k)
    oldest = x.engine_version if x.oldest_in_flight is None else min(x.oldest_in_flight, x.engine_version)
    lag = max(x.trainer_version, info.version) - oldest
    capacity = info.model_copy(update={"staleness_k": k}).capacity(lag)
    total = queued + x.in_flight + 1
    if x.trainer_version - x.engine_version > k:
        return Admission(False, "behind", capacity, queued, x.in_flight, lag)
    if total > capacity:
        return Admission(False, "capacity", capacity, queued, x.in_flight, lag)
    if max_queued_groups and total > max(max_queued_groups, info.groups_per_step):
        return Admission(False, "max_queued", capacity, queued, x.in_flight, lag)
    return Admission(True, "ok", capacity, queued, x.in_flight, lag)


# ---------------------------------------------------------------------------- producer


class GroupProducer:
    """Samples groups continuously until :meth:`stop`; one instance per rollout replica."""

    def __init__(
        self,
        *,
        engine: Engine,
        searcher: Searcher,
        tokenizer: Any,
        data: DataOrder,
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
        keys: RunKeys = DEFAULT_KEYS,
        in_flight_ttl_s: float = 15.0,
        catch_up: Callable[[int], Awaitable[None]] | None = None,
        catch_up_after_s: float = 5.0,
        claim_lease_s: float = 60.0,
        max_attempts: int = 3,
    ) -> None:
        self.engine = engine
        self.searcher = searcher
        self.tokenizer = tokenizer
        self.data = data
        self.redis = redis
        self.metrics = metrics
        self.loop_settings = loop_settings
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.version_poll_s = version_poll_s
        self.producer = producer or "rollout"
        self.max_queued_groups = max_queued_groups
        self.keys = keys
        self.in_flight_ttl_s = in_flight_ttl_s
        self.catch_up = catch_up
        """Loads the trainer's newest published version (the service's verified swap path)."""
        self.catch_up_after_s = catch_up_after_s
        # This incarnation's name on its claims: a restarted replica is another owner, so the claims of
        # the one that died are taken over once their lease runs out.
        self.producer_run = f"{self.producer}-{time.time_ns():x}"
        self.cursor = DataCursor(redis, keys, self.producer_run, claim_lease_s)
        self.claim_lease_s = claim_lease_s
        self.max_attempts = max_attempts
        self._claimed: set[int] = set()
        self._renewed = time.monotonic()
        """Positions this replica claimed and has not yet pushed, dropped or given back."""
        self.trainer_version = 0
        self.pushed = 0
        self.last_admission: Admission | None = None
        self._slots = asyncio.Semaphore(max_groups_in_flight)
        self._buffer: asyncio.Queue[tuple[TrajectoryGroup, int]] = asyncio.Queue(maxsize=buffer_groups)
        self._running = asyncio.Event()
        self._running.set()
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        # Start versions of the groups this replica holds (admitted, not yet pushed or dropped), and
        # whether a decision is pending: both are what other replicas see of this one.
        self._held: list[int] = []
        self._reserved: int | None = None
        self._publish_lock = asyncio.Lock()
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
                start_version = await self._admit()
                if self._stopping or start_version is None:
                    self._slots.release()
                    break
                claim = await self._claim()
                if claim is None:  # stopped while Redis was away
                    self._release(start_version)
                    self._slots.release()
                    break
                task = asyncio.create_task(self._group(claim, start_version))
                self._tasks.add(task)
                task.add_done_callback(self._group_done)
            if self.error is not None:
                raise self.error
        finally:
            for t in [*self._tasks, *aux]:
                t.cancel()
            await asyncio.gather(*self._tasks, *aux, return_exceptions=True)
            await self._give_back()

    async def _claim(self) -> Claim | None:
        """The next position of the shared data order (waits out a Redis outage; None: stopped)."""
        delay = 0.1
        while not self._stopping:
            try:
                claim = await self.cursor.claim()
            except RedisError as e:
                self.metrics.redis_errors.inc()
                log.warning("claiming a data position failed retry_in=%.1fs cause=%s", delay, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._claimed.add(claim.position)
            how = (
                "new"
                if not claim.retaken_from
                else "retried"
                if claim.retaken_from == "released"
                else "retaken"
            )
            self.metrics.data_claims.labels(how=how).inc()
            if how == "new":
                self.metrics.data_position.set(claim.position)
            else:
                log.info("data position %d claimed again how=%s from=%s attempts=%d", claim.position, how,
                         claim.retaken_from, claim.attempts)  # fmt: skip
            return claim
        return None

    async def _give_back(self) -> None:
        """On stop: the positions not yet pushed go back for the next replica (or this one restarted)
        to claim at once, not after their lease."""
        for position in sorted(self._claimed):
            try:
                await self.cursor.release(position, failed=False)
            except RedisError as e:
                log.warning("giving back data position %d failed (its lease will run out): %s", position, e)
        self._claimed.clear()

    async def _renew_claims(self) -> None:
        try:
            held = sorted(self._claimed)
            kept = await self.cursor.renew(held)
        except RedisError as e:
            self.metrics.redis_errors.inc()
            log.warning("renewing data claims failed: %s", e)
            return
        if kept < len(held):
            log.warning("%d of this replica's %d data claims were taken over (their lease ran out): their "
                        "groups will not be pushed", len(held) - kept, len(held))  # fmt: skip

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
        """Entries in the stream the trainer has not acknowledged (undelivered + pending).

        Raises :class:`RedisError` when Redis cannot say; no stream yet is 0.
        """
        return (await read_view(self.redis, self.keys)).unacked

    # ------------------------------------------------------------------ in-flight counts

    def _local_versions(self) -> list[int]:
        return self._held + ([self._reserved] if self._reserved is not None else [])

    async def _redis_now(self) -> float:
        """Redis's clock: every replica's timestamps come from it, so skewed hosts agree on age."""
        sec, usec = await self.redis.time()
        return sec + usec / 1e6

    async def _publish_in_flight(self) -> None:
        """Write this replica's groups in flight and pending decision, with Redis's time."""
        async with self._publish_lock:
            value = json.dumps(
                {
                    "groups": len(self._held),
                    "deciding": int(self._reserved is not None),
                    "oldest_version": min(self._local_versions(), default=None),
                    "at": await self._redis_now(),
                }
            )
            await self.redis.hset(self.keys.in_flight, self.producer, value)

    async def _refresh_in_flight(self) -> None:
        try:
            await self._publish_in_flight()
        except RedisError as e:
            self.metrics.redis_errors.inc()
            log.warning("publishing in-flight groups failed: %s", e)

    async def clear_in_flight(self) -> None:
        """Remove this replica's entry (on shutdown), so others stop counting it at once."""
        await self.redis.hdel(self.keys.in_flight, self.producer)

    def _others_in_flight(self, view: RedisView) -> tuple[int, int, int | None]:
        """(groups, pending decisions, oldest start version) of the other live replicas."""
        groups, deciding, oldest = 0, 0, None
        now = view.now
        for name, raw in view.in_flight.items():
            if name == self.producer:
                continue
            try:
                entry = json.loads(raw)
                n, d, at, v = (
                    int(entry["groups"]),
                    int(entry["deciding"]),
                    float(entry["at"]),
                    entry["oldest_version"],
                )
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring unreadable in-flight entry replica=%s value=%r", name, raw)
                continue
            if now - at > self.in_flight_ttl_s:  # a replica that died without cleaning up
                continue
            groups, deciding = groups + n, deciding + d
            if v is not None:
                oldest = int(v) if oldest is None else min(oldest, int(v))
        return groups, deciding, oldest

    # ------------------------------------------------------------------ admission

    async def _observe_trainer(self) -> RedisView:
        """Read the view; the trainer's version moves on with what it shows."""
        view = await read_view(self.redis, self.keys)
        info = view.info
        newest = max(view.version_key or 0, info.version if info is not None else 0)
        if newest > self.trainer_version:
            self.trainer_version = newest
            self.metrics.trainer_version.set(self.trainer_version)
        return view

    async def _try_admit(self) -> Admission:
        """Reserve a slot in the shared count first, then decide: two replicas deciding at once each
        see the other's reservation, so together they never overshoot the capacity."""
        self._reserved = self.engine.version
        await self._publish_in_flight()
        # This replica's own state is taken before Redis is read, not after: a group pushed while the
        # read is under way then counts twice (in the stream and here) for one decision, instead of
        # nowhere (gone from here, not yet in the stream as read), which let a group in too many.
        local, held, engine_version = self._local_versions(), len(self._held), self.engine.version
        view = await self._observe_trainer()
        others, deciding, others_oldest = self._others_in_flight(view)
        oldest = min([*local, *([others_oldest] if others_oldest is not None else [])], default=None)
        decision = decide(
            AdmissionInputs(
                info=view.info,
                trainer_version=self.trainer_version,
                engine_version=engine_version,
                oldest_in_flight=oldest,
                stream_unacked=view.unacked,
                in_flight=others + deciding + held,
            ),
            max_staleness=self.max_staleness,
            max_queued_groups=self.max_queued_groups,
        )
        self.metrics.admission_capacity.set(decision.capacity)
        self.metrics.queued_groups.set(decision.queued)
        self.metrics.groups_in_flight.set(others + held)
        return decision

    async def _admit(self) -> int | None:
        """Wait until a new group may start; returns the engine version it starts on (None: stopped)."""
        t0 = time.perf_counter()
        behind_since: float | None = None
        logged: str | None = None
        try:
            while not self._stopping:
                _raise_if_cancelling()
                try:
                    d = (
                        await self._try_admit()
                        if self.engine.failed is None
                        else Admission(False, "engine_failed", 0, 0, 0, 0)
                    )
                except RedisError as e:
                    self.metrics.redis_errors.inc()
                    d = Admission(False, "redis_error", 0, 0, 0, 0)
                    if logged != d.reason:
                        log.warning("admission waiting reason=redis_error cause=%s", e)
                        logged = d.reason
                self.last_admission = d
                if d.admit:
                    assert self._reserved is not None
                    self._held.append(self._reserved)
                    self._reserved = None
                    log.info(
                        "group admitted engine=%d trainer=%d lag=%d queued=%d in_flight=%d capacity=%d",
                        self.engine.version, self.trainer_version, d.lag, d.queued, d.in_flight, d.capacity,
                    )  # fmt: skip
                    return self._held[-1]
                self._reserved = None
                await self._refresh_in_flight()
                if logged != d.reason:
                    self._log_wait(d)
                    logged = d.reason
                if d.reason in ("behind", "engine_failed"):  # a whole published version heals a failed swap
                    behind_since = behind_since or time.perf_counter()
                    if (
                        self.catch_up is not None
                        and time.perf_counter() - behind_since >= self.catch_up_after_s
                    ):
                        await self.catch_up(self.trainer_version)
                        behind_since = None
                        continue
                else:
                    behind_since = None
                # Jittered: two replicas retrying in step would each keep seeing the other's pending
                # decision and refuse for ever (a livelock, seen with equal poll intervals).
                await asyncio.sleep(min(self.version_poll_s, 0.25) * random.uniform(0.5, 1.5))
            return None
        finally:
            self._reserved = None
            waited = time.perf_counter() - t0
            if logged is not None:
                self.metrics.admission_wait.inc(waited)
                log.info("admission resumed after %.2f s", waited)

    def _log_wait(self, d: Admission) -> None:
        if d.reason == "no_trainer_info":
            log.info(
                "admission waiting reason=no_trainer_info: no trainer info at %s yet (the trainer "
                "writes it on start); without it no group can be sized to be trained within K",
                self.keys.trainer_info,
            )
        elif d.reason == "redis_error":
            return
        elif d.reason == "engine_failed":
            log.warning("admission waiting reason=engine_failed: %s", self.engine.failed)
        else:
            log.info(
                "admission waiting reason=%s engine=%d trainer=%d k=%d lag=%d queued=%d in_flight=%d "
                "capacity=%d max_queued=%d",
                d.reason,
                self.engine.version,
                self.trainer_version,
                self.max_staleness,
                d.lag,
                d.queued,
                len(self._held),
                d.capacity,
                self.max_queued_groups,
            )

    async def _read_version(self) -> None:
        try:
            await self._observe_trainer()
        except RedisError as e:
            self.metrics.redis_errors.inc()
            log.warning("reading the trainer's state failed: %s", e)

    async def _poll_version(self) -> None:
        while True:
            _raise_if_cancelling()
            await asyncio.sleep(self.version_poll_s)
            await self._read_version()
            await self._refresh_in_flight()
            if time.monotonic() - self._renewed >= self.claim_lease_s / 4:
                self._renewed = time.monotonic()
                await self._renew_claims()

    def is_stale(self, group: TrajectoryGroup) -> bool:
        """True if the group's oldest sampled token is more than K versions behind the trainer."""
        return self.trainer_version - group.min_version > self.max_staleness

    # ------------------------------------------------------------------ groups

    def _release(self, start_version: int) -> None:
        """The group left this replica (pushed, dropped or failed): others stop counting it."""
        self._held.remove(start_version)

    async def _group(self, claim: Claim, start_version: int) -> None:
        row, epoch = self.data.at(claim.position)
        # One id per position of the data order: whoever samples it, however often it is attempted
        group_id = f"{row.prompt_id}:{epoch}:p{claim.position}"
        buffered = False
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
                await self._failed(claim, row, group_id)
                return
            group = TrajectoryGroup(
                group_id=group_id,
                prompt_id=row.prompt_id,
                question=row.question,
                gold_answers=row.golds,
                trajectories=[r.trajectory for r in results],  # type: ignore[union-attr]
                created_at=time.time(),
                producer=self.producer,
                run_id=self.keys.run_id,
            )
            if self.is_stale(group):
                await self._drop(group, claim.position)
                return
            # Waiting here holds the group's slot: a full buffer stops new groups (backpressure).
            await self._buffer.put((group, start_version, claim.position))
            buffered = True
            self.metrics.buffer.set(self._buffer.qsize())
        finally:
            if not buffered:
                self._release(start_version)
            self._slots.release()

    async def _settle(self, what: str, position: int, op: Callable[[], Awaitable[Any]]) -> Any:
        """Run a claim-ending write, retrying while Redis is away (until stopped: then the lease runs out
        and the position is sampled again)."""
        delay = 0.1
        while True:
            try:
                out = await op()
                self._claimed.discard(position)
                return out
            except RedisError as e:
                self.metrics.redis_errors.inc()
                log.warning("%s of data position %d failed retry_in=%.1fs cause=%s", what, position, delay, e)
                if self._stopping:
                    return None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _failed(self, claim: Claim, row: PromptRow, group_id: str) -> None:
        """A failed attempt gives its position back for another; the last allowed one drops it."""
        if claim.attempts + 1 >= self.max_attempts:
            why = "failed"
            if await self._settle(
                "drop", claim.position, lambda: self.cursor.drop(claim.position, row.prompt_id, group_id, why)
            ):
                self.metrics.data_dropped.labels(why=why).inc()
                log.warning("data position %d dropped: failed %d times group_id=%s", claim.position,
                            claim.attempts + 1, group_id)  # fmt: skip
            return
        await self._settle("release", claim.position, lambda: self.cursor.release(claim.position))

    async def _drop(self, group: TrajectoryGroup, position: int) -> None:
        why = "stale"
        if await self._settle(
            "drop", position, lambda: self.cursor.drop(position, group.prompt_id, group.group_id, why)
        ):
            self.metrics.data_dropped.labels(why=why).inc()
        else:
            self.metrics.data_claims_lost.inc()
        self.metrics.stale_drops.inc()
        self.metrics.groups.labels(status="stale").inc()
        log.warning(
            "stale group dropped group_id=%s min_version=%d trainer=%d k=%d (admission should prevent "
            "this: a missed trainer info update or a notice that came late)",
            group.group_id,
            group.min_version,
            self.trainer_version,
            self.max_staleness,
        )

    async def _pusher(self) -> None:
        while True:
            _raise_if_cancelling()
            group, start_version, position = await self._buffer.get()
            if self.is_stale(group):
                await self._drop(group, position)
                self._release(start_version)
                self.metrics.buffer.set(self._buffer.qsize())
                continue
            data = encode_group(group)
            delay = 0.1
            retried = False
            while True:
                try:
                    entry = await self.cursor.push(position, GROUP_FIELD.decode(), data)
                    break
                except RedisError as e:
                    self.metrics.redis_errors.inc()
                    log.warning("push failed group_id=%s retry_in=%.1fs cause=%s", group.group_id, delay, e)
                    retried = True
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
            self._claimed.discard(position)
            if entry is None:
                # Taken over (this replica's lease ran out), or, after a failed attempt, pushed by that
                # attempt (its reply lost): either way not pushed now, and the stream has it at most once.
                self._release(start_version)
                await self._refresh_in_flight()
                self.metrics.data_claims_lost.inc()
                self.metrics.groups.labels(status="lost_claim").inc()
                log.warning("group not pushed group_id=%s: data position %d is no longer this replica's%s",
                            group.group_id, position, " (or the failed attempt before pushed it)" if retried else "")  # fmt: skip
                self.metrics.buffer.set(self._buffer.qsize())
                continue
            # Released only once in the stream: in between, others count it in flight, not nowhere.
            self._release(start_version)
            await self._refresh_in_flight()
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

"""The rollout service's logic, without the web framework: engine, retriever, producer, answers,
weight updates. ``app`` wires it to HTTP routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Literal

from llds_proto.messages import (
    AnswerRequest,
    AnswerResponse,
    AnswerTurn,
    HealthResponse,
    WeightTransferInfo,
    WeightTransferInit,
    WeightTransferUpdate,
    WeightUpdateNotice,
    WeightUpdateResponse,
)
from llds_proto.streams import RunKeys
from llds_rollout import faults
from llds_rollout.agent import Episode, LoopSettings, run_episode
from llds_rollout.answer_admission import AnswerAdmission, AnswerSaturatedError, AnswerTicket
from llds_rollout.config import RolloutSettings
from llds_rollout.engine import Engine, EngineError, WeightLoadError, WeightSwapError, build_engine
from llds_rollout.engine.transfer import CollectiveReceiver, WeightTransferError, collective_receiver
from llds_rollout.metrics import RolloutMetrics
from llds_rollout.retrieval import RetrieverClient, RetrieverError
from llds_rollout.weights import (
    WeightsError,
    identity,
    load_tensors,
    published_dir_name,
    read_shapes,
    resolve_folder,
    verify_published,
)
from llds_server.settings import redact_url

log = logging.getLogger("llds_rollout.service")


def new_request_id() -> str:
    """A short random id for one answer (in its response and its log line)."""
    return uuid.uuid4().hex[:12]


@dataclass
class AgentRun:
    """One finished search-agent request: the episode and what the response reports about it."""

    episode: Episode
    request_id: str
    versions: list[int]
    """Every weights version that produced a token, ascending."""
    latency_s: float

    def response(self) -> AnswerResponse:
        """The ``/answer`` response."""
        return AnswerResponse(
            answer=self.episode.trajectory.answer,
            turns=self.episode.turns,
            weights_version=self.versions[0],
            weights_versions=self.versions,
            latency_s=self.latency_s,
            request_id=self.request_id,
        )


AgentEvent = (
    tuple[Literal["turn"], AnswerTurn] | tuple[Literal["done"], AgentRun] | tuple[Literal["error"], Exception]
)
"""What :meth:`RolloutService.stream_agent` yields."""


class NotReadyError(RuntimeError):
    """The model is not loaded yet (or failed to load) (-> 503)."""


class NotProducingError(RuntimeError):
    """Pause/resume on a replica that does not produce training data (-> 409)."""


class _AnswerGate:
    """Readers are /answer calls, the writer a weight swap: an answer's turns all see one version.

    Writer-preferring: once a swap waits, new answers queue behind it, so a stream of answers cannot
    starve weight updates.
    """

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextlib.asynccontextmanager
    async def read(self):  # type: ignore[no-untyped-def]
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writer and not self._writers_waiting)
            self._readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def write(self):  # type: ignore[no-untyped-def]
        async with self._cond:
            self._writers_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._writer and self._readers == 0)
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            async with self._cond:
                self._writer = False
                self._cond.notify_all()


class RolloutService:
    """One rollout replica."""

    def __init__(self, settings: RolloutSettings, engine: Engine | None = None) -> None:
        self.settings = settings
        self.metrics = RolloutMetrics()
        self.engine = engine or build_engine(settings.model, settings.engine, settings.initial_version)
        self.tokenizer: Any = None
        self.searcher: RetrieverClient | None = None
        self.producer: Any = None
        self.redis: Any = None
        self.load_error: str | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._swap_lock = asyncio.Lock()
        self._gate = _AnswerGate()
        self.answer_admission = AnswerAdmission(
            settings.answer_max_in_flight, settings.answer_max_queued, settings.answer_retry_after_s
        )
        self.metrics.answers_in_flight.set_function(lambda: self.answer_admission.in_flight)
        self.metrics.answers_queued.set_function(lambda: self.answer_admission.queued)
        self.name, self.url = settings.replica()
        self.keys = RunKeys(settings.run_id)
        self._catch_up_skip_logged = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Load the model (in a thread), then start producing if training. Errors land in /health."""
        s = self.settings
        try:
            from transformers import AutoTokenizer

            self.tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, s.model)
            await asyncio.to_thread(self.engine.start)
        except Exception as e:
            self.load_error = f"{type(e).__name__}: {e}"
            log.exception("model load failed model=%s", s.model)
            return
        self.metrics.weights_version.set(self.engine.version)
        self.searcher = RetrieverClient(
            s.retriever_url,
            topk=s.topk,
            concurrency=s.retriever_concurrency,
            timeout_s=s.retriever_timeout_s,
            retries=s.retriever_retries,
            backoff_s=s.retriever_backoff_s,
            on_latency=self.metrics.retriever_latency.observe,
            on_error=lambda cause: self.metrics.retriever_errors.labels(cause=cause).inc(),
        )
        if s.train:
            self._start_producer()
        log.info(
            "rollout ready name=%s url=%s version=%d train=%s",
            self.name,
            self.url,
            self.engine.version,
            s.train,
        )

    def _start_producer(self) -> None:
        import redis.asyncio as aioredis

        from llds_rollout.dataset import DataOrder, load_rows
        from llds_rollout.scheduler import GroupProducer

        s = self.settings
        assert s.dataset is not None and self.searcher is not None
        rows = load_rows(s.dataset)
        self.redis = aioredis.Redis.from_url(s.redis_url, socket_timeout=5, socket_connect_timeout=5)
        self.producer = GroupProducer(
            engine=self.engine,
            searcher=self.searcher,
            tokenizer=self.tokenizer,
            data=DataOrder(rows, shuffle=s.shuffle, seed=s.seed),
            redis=self.redis,
            metrics=self.metrics,
            loop_settings=self.loop_settings(train=True),
            group_size=s.group_size,
            max_staleness=s.max_staleness,
            max_groups_in_flight=s.max_groups_in_flight,
            max_queued_groups=s.max_queued_groups,
            buffer_groups=s.redis_buffer_groups,
            version_poll_s=s.version_poll_s,
            producer=self.name,
            keys=self.keys,
            in_flight_ttl_s=s.in_flight_ttl_s,
            catch_up=self.catch_up,
            catch_up_after_s=s.catch_up_after_s,
            claim_lease_s=s.data_claim_lease_s,
            max_attempts=s.max_attempts,
        )
        self._tasks.append(asyncio.create_task(self._produce()))

    async def _produce(self) -> None:
        """Register, catch up with what the trainer published before this replica started, produce."""
        try:
            await self._register()
            await self._catch_up_on_start()
            await self.producer.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("group production stopped")

    async def _register(self) -> None:
        """HSET this replica into the registry; retried while Redis is unreachable."""
        from redis.exceptions import RedisError

        delay = 0.5
        while True:
            try:
                await self._beat()
                log.info("registered replica name=%s url=%s", self.name, redact_url(self.url))
                self._tasks.append(asyncio.create_task(self._heartbeat()))
                return
            except RedisError as e:
                self.metrics.redis_errors.inc()
                log.warning("replica registration failed retry_in=%.1fs cause=%s", delay, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _beat(self) -> None:
        """Registry entry and heartbeat, together (a replica the trainer pruned while it was slow to
        beat comes back by itself)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.keys.registry, self.name, self.url)
        pipe.zadd(self.keys.heartbeats, {self.name: time.time()})
        await pipe.execute()

    async def _heartbeat(self) -> None:
        from redis.exceptions import RedisError

        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                await self._beat()
            except RedisError as e:
                self.metrics.redis_errors.inc()
                log.warning("replica heartbeat failed: %s", e)

    async def stop(self) -> None:
        if self.producer is not None:
            self.producer.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.redis is not None:
            from redis.exceptions import RedisError

            try:
                await self.redis.hdel(self.keys.registry, self.name)
                await self.redis.zrem(self.keys.heartbeats, self.name)
                await self.producer.clear_in_flight()
            except RedisError as e:
                log.warning("replica deregistration failed: %s", e)
            await self.redis.aclose()
        if self.searcher is not None:
            await self.searcher.aclose()
        await asyncio.to_thread(self.engine.shutdown)

    # ------------------------------------------------------------------ logic

    def loop_settings(self, *, train: bool, max_turns: int | None = None) -> LoopSettings:
        s = self.settings
        return LoopSettings(
            max_turns=(s.max_turns if train else s.answer_max_turns) if max_turns is None else max_turns,
            max_tokens_per_turn=s.max_tokens_per_turn,
            max_context_tokens=s.max_context_tokens,
            max_obs_tokens=s.max_obs_tokens,
            temperature=s.temperature if train else 0.0,
            top_p=s.top_p if train else 1.0,
            reward=s.reward,
        )

    def health(self) -> HealthResponse:
        detail: dict[str, object] = {
            "weights_version": self.engine.version,
            "engine": self.settings.engine.type,
            "model": self.settings.model,
            "train": self.settings.train,
        }
        if self.producer is not None:
            detail.update(
                trainer_version=self.producer.trainer_version,
                paused=self.producer.paused,
                groups_pushed=self.producer.pushed,
            )
        if self.load_error is not None:
            detail["error"] = self.load_error
            return HealthResponse(status="degraded", service="rollout", detail=detail)
        if self.engine.failed is not None:
            detail["error"] = self.engine.failed
            return HealthResponse(status="degraded", service="rollout", detail=detail)
        if self.producer is not None and self.producer.error is not None:
            detail["error"] = f"group production stopped: {self.producer.error!r}"
            return HealthResponse(status="degraded", service="rollout", detail=detail)
        if not self.engine.ready or self.tokenizer is None:
            return HealthResponse(status="starting", service="rollout", detail=detail)
        return HealthResponse(status="ok", service="rollout", detail=detail)

    def require_loaded(self) -> None:
        if self.load_error is not None:
            raise NotReadyError(f"model failed to load: {self.load_error}")
        if not self.engine.ready or self.tokenizer is None or self.searcher is None:
            raise NotReadyError("model is still loading")

    def require_ready(self) -> None:
        """Loaded and serving one whole version (:class:`NotReadyError`, 503, otherwise)."""
        self.require_loaded()
        if self.engine.failed is not None:
            raise NotReadyError(self.engine.failed)

    def admit_answer(self) -> AnswerTicket:
        """A slot (running or queued) for one ``/answer``; :class:`NotReadyError` or
        :class:`AnswerSaturatedError` (both 503 at the edge) when there is none."""
        self.require_ready()
        try:
            return self.answer_admission.admit()
        except AnswerSaturatedError:
            self.metrics.answers_rejected.inc()
            raise

    async def answer(
        self,
        req: AnswerRequest,
        on_turn: Callable[[AnswerTurn], None] | None = None,
        ticket: AnswerTicket | None = None,
    ) -> AnswerResponse:
        """Greedy search-agent answer; :class:`RetrieverError`/:class:`EngineError` -> 503 at the edge.

        ``on_turn`` sees each turn as it finishes (the streaming route uses it). ``ticket``: the
        request's admission (:meth:`admit_answer`), taken here when not given.
        """
        run = await self.run_agent(
            req.question,
            self.loop_settings(train=False, max_turns=req.max_turns),
            on_turn=on_turn,
            ticket=ticket,
        )
        return run.response()

    async def run_agent(
        self,
        question: str,
        loop: LoopSettings,
        *,
        request_id: str | None = None,
        on_turn: Callable[[AnswerTurn], None] | None = None,
        ticket: AnswerTicket | None = None,
        route: str = "/answer",
        user: str | None = None,
    ) -> AgentRun:
        """The search agent on one question, under the answer admission and the answer gate: what
        ``/answer`` and ``/agent/v1`` serve. ``request_id`` (default: a fresh one), ``route`` and
        ``user`` (an end user's id a client sent) go into the log line."""
        ticket = ticket or self.admit_answer()
        try:
            await ticket.wait()
            self.metrics.answer_queue_wait.observe(ticket.queued_s)
            return await self._run_agent(question, loop, request_id or new_request_id(), on_turn, route, user)
        finally:
            ticket.release()

    def stream_agent(
        self,
        question: str,
        loop: LoopSettings,
        ticket: AnswerTicket,
        *,
        request_id: str | None = None,
        route: str = "/answer/stream",
        user: str | None = None,
    ) -> AsyncGenerator[AgentEvent, None]:
        """:meth:`run_agent` as events: a ``turn`` per finished turn, then ``done`` (the
        :class:`AgentRun`) or ``error`` (the :class:`RetrieverError`, :class:`EngineError` or
        :class:`NotReadyError` that ended it).

        The run starts here, not when the events are first read: a client gone before its response
        body starts would leave a reader that never runs, and its slot taken for ever. ``ticket`` is
        released when the run ends, whether it ran, failed or was cancelled before it started;
        closing the events cancels the run.
        """
        events: asyncio.Queue[AgentEvent | None] = asyncio.Queue()

        async def run() -> None:
            try:
                done = await self.run_agent(
                    question,
                    loop,
                    request_id=request_id,
                    on_turn=lambda t: events.put_nowait(("turn", t)),
                    ticket=ticket,
                    route=route,
                    user=user,
                )
                events.put_nowait(("done", done))
            except (RetrieverError, EngineError, NotReadyError) as e:
                events.put_nowait(("error", e))
            finally:
                events.put_nowait(None)

        task = asyncio.create_task(run())
        task.add_done_callback(lambda _: ticket.release())

        async def read() -> AsyncGenerator[AgentEvent, None]:
            try:
                while (item := await events.get()) is not None:
                    yield item
            finally:
                task.cancel()

        return read()

    async def _run_agent(
        self,
        question: str,
        loop: LoopSettings,
        request_id: str,
        on_turn: Callable[[AnswerTurn], None] | None,
        route: str,
        user: str | None,
    ) -> AgentRun:
        self.require_ready()
        assert self.searcher is not None
        t0 = time.perf_counter()
        consistent = self.settings.answer_consistency == "version"
        async with self._gate.read() if consistent else contextlib.nullcontext():
            ep = await run_episode(
                self.engine,
                self.searcher,
                self.tokenizer,
                question,
                [],
                loop,
                trajectory_id=f"answer-{request_id}",
                on_turn=on_turn,
            )
        self.metrics.observe_episode(ep, "answer")
        latency = time.perf_counter() - t0
        self.metrics.answer_latency.observe(latency)
        versions = sorted({v for g in ep.generations for v in g.versions} or {self.engine.version})
        log.info(
            "answer route=%s request_id=%s%s turns=%d searches=%d finish=%s version=%s latency_s=%.2f",
            route,
            request_id,
            "" if user is None else f" user={user!r}",
            len(ep.turns),
            ep.trajectory.num_valid_searches,
            ep.trajectory.finish_reason,
            versions,
            latency,
        )
        return AgentRun(episode=ep, request_id=request_id, versions=versions, latency_s=latency)

    async def update_weights(self, notice: WeightUpdateNotice) -> WeightUpdateResponse:
        """Verify, load and swap in a published folder; raises :class:`WeightsError` (-> 400) or
        :class:`WeightSwapError` (-> 502). Taken by an engine whose last swap failed: that heals it."""
        self.require_loaded()
        t0 = time.perf_counter()
        async with self._swap_lock:
            await self._load_published(notice.version, notice.path)
        load_s = time.perf_counter() - t0
        self._swapped(load_s)
        log.info("weights updated version=%d step=%d load_s=%.3f", notice.version, notice.step, load_s)
        return WeightUpdateResponse(version=self.engine.version, load_s=load_s)

    async def _load_published(self, version: int, path: str) -> None:
        """The one verified swap path (under the swap lock): the folder pinned against the trainer's
        clean-up, its checks, the tensors (or, for an engine that reads the folder itself, their
        shapes from the headers), the swap behind the answer gate, and a last look that no file
        changed meanwhile. A refused folder leaves the old weights serving (WeightsError); a swap
        that failed after it began, or whose files changed under it, leaves the engine failed,
        serving nothing until a whole version loads (WeightSwapError)."""
        root = self.settings.weights_root
        pinned = False
        try:
            if root is None:
                raise WeightsError("this replica has no weights_root configured")
            if version <= self.engine.version:
                raise WeightsError(f"version {version} is not newer than serving {self.engine.version}")
            pinned = await self._pin(version)
            whole = self.engine.version
            folder = resolve_folder(root, path)
            before = await asyncio.to_thread(identity, folder)
            published = await asyncio.to_thread(verify_published, root, path, version)
            read = read_shapes if self.engine.reads_folder else load_tensors
            tensors = await asyncio.to_thread(read, published)
            await faults.before_swap()
            async with self._gate.write():
                await self.engine.update_weights(tensors, published.folder, version)
                after = await asyncio.to_thread(identity, folder)
                if after != before:
                    changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
                    self.engine.mark_failed(
                        f"the files of version {version} changed while it loaded ({changed[:3]}): the "
                        "weights may be mixed: serving nothing until a whole version loads",
                        version=whole,
                    )
                    raise WeightSwapError(self.engine.failed or "")
        except (WeightsError, WeightLoadError) as e:
            self.metrics.weight_rejects.inc()
            log.warning("weight update rejected version=%d path=%s cause=%s", version, path, e)
            raise WeightsError(str(e)) from e
        except WeightSwapError as e:
            self.metrics.weight_swap_failures.inc()
            log.error("weight swap failed version=%d path=%s: %s", version, path, e)
            raise
        finally:
            if pinned:
                await self._unpin(version)

    async def _pin(self, version: int) -> bool:
        """Tell the trainer this replica reads ``version``'s folder (RunKeys.weight_pins); False
        without Redis (a replica that only answers) or when Redis does not answer."""
        from redis.exceptions import RedisError

        if self.redis is None:
            return False
        try:
            await self.redis.zadd(self.keys.weight_pins, {f"{version}/{self.name}": time.time()})
        except RedisError as e:
            self.metrics.redis_errors.inc()
            log.warning("could not pin version %d against clean-up: %s", version, e)
            return False
        return True

    async def _unpin(self, version: int) -> None:
        from redis.exceptions import RedisError

        try:
            await self.redis.zrem(self.keys.weight_pins, f"{version}/{self.name}")
        except RedisError as e:  # the pin expires by itself (the trainer's pin_ttl_s)
            self.metrics.redis_errors.inc()
            log.warning("could not unpin version %d: %s", version, e)

    def _swapped(self, load_s: float) -> None:
        self.metrics.weights_version.set(self.engine.version)
        self.metrics.swap_seconds.observe(load_s)

    async def catch_up(self, version: int) -> None:
        """Load published ``version`` from ``weights_root`` if it is newer than the engine's.

        For a replica that started after the trainer published, or missed a notice: without it
        admission would wait forever for weights within K. Failures are logged and counted; the
        replica keeps serving what it has and admission tries again later.
        """
        if version <= self.engine.version:
            return
        if self.settings.weights_root is None or self.settings.engine.receives_nccl:
            if not self._catch_up_skip_logged:
                log.warning(
                    "cannot catch up to version %d by itself (%s): waiting for the trainer to send it",
                    version,
                    "no weights_root" if self.settings.weights_root is None else "weights arrive over NCCL",
                )
                self._catch_up_skip_logged = True
            return
        t0 = time.perf_counter()
        path = published_dir_name(version)
        from_version = self.engine.version
        async with self._swap_lock:
            if version <= self.engine.version:  # a notice got there first
                return
            try:
                await self._load_published(version, path)
            except (WeightsError, WeightSwapError) as e:
                self.metrics.catch_ups.labels(status="failed").inc()
                log.warning("catch-up to version %d failed (still serving %d): %s", version, from_version, e)
                return
        load_s = time.perf_counter() - t0
        self._swapped(load_s)
        self.metrics.catch_ups.labels(status="ok").inc()
        log.info("caught up from version %d to %d path=%s load_s=%.3f", from_version, version, path, load_s)

    async def _catch_up_on_start(self) -> None:
        from redis.exceptions import RedisError

        try:
            raw = await self.redis.get(self.keys.trainer_version)
        except RedisError as e:
            self.metrics.redis_errors.inc()
            log.warning("reading the trainer version at start failed (admission catches up later): %s", e)
            return
        if raw is not None:
            await self.catch_up(int(raw))

    # ------------------------------------------------------------------ NCCL weight transfer

    def _receiver(self) -> CollectiveReceiver:
        """The engine's NCCL side; :class:`WeightTransferStateError` (-> 409) names the setting if none."""
        self.require_ready()
        return collective_receiver(self.engine, self.settings.engine)

    def weight_transfer_info(self) -> WeightTransferInfo:
        """What the trainer needs to place this replica in its NCCL group."""
        rx = self._receiver()
        return WeightTransferInfo(backend="nccl", workers=rx.transfer_workers, version=self.engine.version)

    async def init_weight_transfer(self, req: WeightTransferInit) -> WeightTransferInfo:
        """Join the trainer's NCCL group (blocks until every rank has met); a bad placement is a 400."""
        rx = self._receiver()
        if req.rank_offset + rx.transfer_workers > req.world_size:
            raise WeightsError(
                f"ranks {req.rank_offset}..{req.rank_offset + rx.transfer_workers - 1} of this replica's "
                f"{rx.transfer_workers} workers do not fit a group of {req.world_size}"
            )
        async with self._swap_lock:
            await rx.init_weight_transfer(req.model_dump(exclude={"schema_version"}))
        log.info(
            "joined NCCL weight-transfer group master=%s:%d rank_offset=%d world_size=%d",
            req.master_address, req.master_port, req.rank_offset, req.world_size,
        )  # fmt: skip
        return self.weight_transfer_info()

    async def receive_weights(self, req: WeightTransferUpdate) -> WeightUpdateResponse:
        """Check, then (unless ``dry_run``) receive ``req.version`` over NCCL between requests.

        A refused update raises :class:`WeightsError` (-> 400) with the old weights serving; a
        transfer that fails after it started leaves no version serving: this replica reports the
        error in /health and stops serving (:class:`WeightTransferError` -> 502).
        """
        rx = self._receiver()
        t0 = time.perf_counter()
        async with self._swap_lock:
            try:
                if req.version <= self.engine.version:
                    raise WeightsError(
                        f"version {req.version} is not newer than serving {self.engine.version}"
                    )
                rx.check_transfer(req.names, req.shapes)
            except (WeightsError, WeightLoadError) as e:
                self.metrics.weight_rejects.inc()
                log.warning("NCCL weight update rejected version=%d cause=%s", req.version, e)
                raise WeightsError(str(e)) from e
            if req.dry_run:
                return WeightUpdateResponse(version=self.engine.version, load_s=0.0)
            try:
                async with self._gate.write():
                    await rx.receive_weights(req.names, req.dtype_names, req.shapes, req.version)
            except WeightTransferError as e:
                self.load_error = str(e)
                log.error("NCCL weight update failed version=%d cause=%s", req.version, e)
                raise
        load_s = time.perf_counter() - t0
        self.metrics.weights_version.set(self.engine.version)
        self.metrics.swap_seconds.observe(load_s)
        log.info("weights received over NCCL version=%d step=%d load_s=%.3f", req.version, req.step, load_s)
        return WeightUpdateResponse(version=self.engine.version, load_s=load_s)

    def pause(self) -> None:
        if self.producer is None:
            raise NotProducingError("this replica does not produce training data (train=false)")
        self.producer.pause()
        log.info("production paused")

    def resume(self) -> None:
        if self.producer is None:
            raise NotProducingError("this replica does not produce training data (train=false)")
        self.producer.resume()
        log.info("production resumed")


__all__ = [
    "EngineError",
    "NotProducingError",
    "NotReadyError",
    "RetrieverError",
    "RolloutService",
    "WeightsError",
]

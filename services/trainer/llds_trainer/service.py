"""The trainer service loop: queue -> step -> log -> checkpoint -> ack -> trim -> publish -> info.

Ordering is what makes a kill -9 at any point safe (see :mod:`llds_trainer.queue`):

1. fetch groups (they stay pending in Redis); drop invalid / foreign / duplicate / empty / ahead /
   orphaned / stale ones (acknowledged, counted by reason);
2. train one step; append its record to ``train_log.jsonl``;
3. if the step publishes, bump the version *before* any checkpoint, so a checkpoint names the version
   its weights go out as; checkpoint (atomic rename) every ``checkpoint_every`` steps, on the last
   step and when stopped; acknowledge the groups the checkpoint covers, trim the stream;
4. if the step publishes: write the folder (marker last), set the run's version key, notify the
   rollout replicas (``weight_sync = "nccl"``: no folder, :mod:`llds_trainer.nccl_sync`);
5. write :class:`llds_proto.messages.TrainerInfo` (admission control of the rollouts).

With several ranks, rank 0 does all of the above; the others train, and join the checkpoint and the
publish, which are collectives (under ``parallel = "fsdp"`` every rank writes its shards and the
published weights are gathered from every rank). Rank 0 decides when the loop ends (it broadcasts
the groups, or None on a stop), so every rank leaves it at the same step.

Publishing and checkpointing have independent cadences, so a restart may come back to weights older
than what was published: :mod:`llds_trainer.lineage` then orphans the lost versions and republishes
the restored weights under a fresh number. On every start the current version is republished.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from llds_proto import steplog as K
from llds_proto import streams
from llds_proto.codec import decode_group, encode_group
from llds_proto.messages import TrainerInfo, TrajectoryGroup, WeightUpdateNotice
from llds_trainer.config import TrainerConfig
from llds_trainer.core import NoLearningSignal
from llds_trainer.faults import failpoint
from llds_trainer.lineage import Lineage
from llds_trainer.metrics import TrainerMetrics

log = logging.getLogger("llds.trainer")

TRAIN_LOG = "train_log.jsonl"
POISON_TEXT = {
    "invalid": "undecodable",
    "out_of_vocab": "a token id outside the policy's vocabulary",
    "too_long": "a sequence longer than the policy's positions",
    "failed": "it made {n} training steps fail (counted across restarts)",
}
CONFIG_FILE = "trainer_config.toml"


class VersionKeyError(RuntimeError):
    """The run's version key in Redis holds something other than a version number."""


class CPUShare:
    """Before each forward on the CPU, makes room for a rollout replica of the run that is sampling
    (``RunKeys.in_flight`` entries with groups, fresher than ``ttl_s``; read at most every ``every_s``):
    ``busy`` > 0 runs that many torch threads meanwhile, ``busy`` = 0 waits until none samples (at most
    ``max_wait_s``); ``idle`` threads otherwise."""

    def __init__(
        self, redis: Any, key: str, busy: int, idle: int, every_s: float = 0.5, ttl_s: float = 15.0,
        max_wait_s: float = 60.0,
    ):  # fmt: skip
        import torch

        self.redis, self.key = redis, key
        self.every_s, self.ttl_s, self.max_wait_s = every_s, ttl_s, max_wait_s
        self.busy, self.idle = busy, idle or torch.get_num_threads()
        self._checked = 0.0
        self.sampling = False
        self.waited_s = 0.0
        """Seconds spent waiting for the rollout (``busy`` = 0), summed over the trainer's life."""

    def rollout_sampling(self) -> bool:
        """Whether a replica has groups in flight now (a failed read counts as not sampling)."""
        from redis.exceptions import RedisError

        try:
            entries = self.redis.hgetall(self.key)
            now = float(self.redis.time()[0])
        except RedisError as e:  # a Redis hiccup must not stop training: logged, counted as idle
            log.warning("reading the rollout's in-flight groups failed: %s", e)
            return False
        for raw in entries.values():
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if int(entry.get("groups", 0)) > 0 and now - float(entry.get("at", 0)) <= self.ttl_s:
                return True
        return False

    def __call__(self) -> None:
        import torch

        t = time.monotonic()
        if t - self._checked >= self.every_s:
            self._checked = t
            self.sampling = self.rollout_sampling()
        if self.busy == 0 and self.sampling:
            start = time.monotonic()
            while self.sampling and time.monotonic() - start < self.max_wait_s:
                time.sleep(min(self.every_s, 0.2))
                self.sampling = self.rollout_sampling()
            self._checked = time.monotonic()
            self.waited_s += self._checked - start
            if self.sampling:
                log.warning("the rollout sampled for %.0f s; running the forward beside it", self.max_wait_s)
        want = self.busy if self.sampling and self.busy > 0 else self.idle
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)


class TrainerService:
    """Owns the trainer, the queue and the outputs of one process; the HTTP app reads its state."""

    def __init__(self, cfg: TrainerConfig, admin_token: str | None = None):
        self.cfg = cfg
        self.keys = streams.RunKeys(cfg.run_id)
        self.admin_token = admin_token
        self.state = "starting"
        self.error: str | None = None
        self.metrics = TrainerMetrics()
        self.history: deque[dict[str, Any]] = deque(maxlen=cfg.history_limit)
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.trainer: Any = None
        self.queue: Any = None
        self.redis: Any = None
        self.tokenizer: Any = None
        self._unacked: list[str] = []
        self._refused: set[str] = set()
        """Entry ids trained on and not acknowledged yet (acks happen only at checkpoints)."""
        self.start_digest: str | None = None
        self._uniform_skipped = 0
        """Groups skipped by dynamic sampling while the current step's batch was read."""
        self._batch: list[Any] = []
        """Rank 0: the queue entries of the batch being trained (what a failed step blames)."""
        self._carry: list[Any] = []
        """Rank 0: entries of a failed step not set aside, trained first by the next attempt."""
        self._dead_lettered = 0
        self._failed_attempts = 0
        self._failed_in_row = 0
        self._prev_timings: dict[str, float | None] = {
            K.PERF_PREV_CHECKPOINT_S: None, K.PERF_PREV_PUBLISH_S: None, K.PERF_PREV_NOTIFY_S: None}  # fmt: skip
        """Checkpoint, publish and notify times of the step before, for the next step's record."""
        self.completed_step = 0
        self.run_dir = Path(cfg.run_dir)
        self.writers: list[Any] = []
        self._nccl: Any = None

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Load the model, join the process group, connect Redis, resume."""
        import redis
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry
        from transformers import AutoTokenizer

        from llds_trainer import checkpoint as ckpt
        from llds_trainer.core import Trainer, resolve_device
        from llds_trainer.dist import DistContext
        from llds_trainer.queue import StreamQueue

        dist = DistContext.from_env(resolve_device(self.cfg.device))
        if self.cfg.weight_sync == "nccl" and dist.is_main:
            from llds_trainer.nccl_sync import require_nccl

            require_nccl()  # before the model loads: a missing GPU or vLLM fails in seconds
        self.trainer = Trainer(self.cfg, dist)
        self.tokenizer = AutoTokenizer.from_pretrained(self.cfg.model)
        if dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if self.cfg.publish_every % self.cfg.checkpoint_every:
                log.warning(
                    "publish_every %d is not a multiple of checkpoint_every %d: a crash orphans the "
                    "versions published since the last checkpoint, and the groups they sampled are "
                    "dropped (docs/reliability.md)", self.cfg.publish_every, self.cfg.checkpoint_every,
                )  # fmt: skip
            # Ride out a Redis restart (~1 min of retries) instead of failing mid-step: every command
            # the trainer sends is safe to repeat (XACK, XTRIM, SET; a lost XREADGROUP reply leaves the
            # entries pending, and XAUTOCLAIM hands them back).
            self.redis = redis.Redis.from_url(
                self.cfg.redis_url, retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), retries=30)
            )
            self.queue = StreamQueue(
                self.redis,
                self.cfg.consumer_name,
                claim_idle_ms=self.cfg.claim_idle_ms,
                block_ms=self.cfg.read_block_ms,
                stream=self.keys.stream,
                dead_letter=self.keys.dead_letter,
                failures=self.keys.entry_failures,
            )
            self.queue.ensure_group()
            if self.cfg.threads_while_sampling >= 0 and self.trainer.device.type == "cpu":
                self.trainer.scorer.before_forward = CPUShare(
                    self.redis, self.keys.in_flight, self.cfg.threads_while_sampling, self.cfg.num_threads,
                    max_wait_s=self.cfg.rollout_wait_max_s,
                )  # fmt: skip
        latest = ckpt.latest_checkpoint(self.cfg.run_dir) if self.cfg.resume else None
        if latest is not None:
            self.trainer.load_checkpoint(latest)
            log.info(
                "resumed from %s (step %d, version %d)",
                latest,
                self.trainer.state.step,
                self.trainer.state.version,
            )
        plan: tuple[int, dict[str, Any]] | None = None
        if dist.is_main:
            self.start_digest = self._start_digest(resumed=latest is not None)
            self._cut_log(self.trainer.state.step)
            from llds_trainer.tracking import make_writers

            self.writers = make_writers(
                list(self.cfg.trackers),
                self.run_dir,
                wandb_project=self.cfg.wandb_project,
                wandb_mode=self.cfg.wandb_mode,
                config=self.cfg.model_dump(mode="json"),
            )
            plan = self._resume_version()
        # Every rank needs the version: the "stale" importance correction compares token versions to it.
        version, lineage = dist.broadcast_object(plan)
        self.trainer.state.version = version
        self.trainer.state.lineage = Lineage.from_state(lineage)
        if dist.is_main:
            self.completed_step = self.trainer.state.step
            self.metrics.step.set(self.trainer.state.step)
        # Always republish on start: a rollout waiting for this version (or one that lost it)
        # gets it now instead of waiting for the next step's publish.
        self._publish(self.trainer.state.version, self.trainer.state.step)
        if dist.is_main:
            if self.cfg.weight_sync == "filesystem":
                from llds_trainer.publish import gc_versions

                gc_versions(Path(self.cfg.weights_root), self.cfg.keep_versions, self.cfg.keep_versions_every,
                            self._pinned_versions())  # fmt: skip
            self._write_info()
            self._tidy_stream()
        dist.barrier()
        self.state = "waiting"

    def _published_version(self) -> int:
        """Highest version that may have reached a rollout: a complete folder or the version key."""
        from llds_trainer.publish import newest_published

        raw = self.redis.get(self.keys.trainer_version)
        in_redis = 0
        if raw is not None:
            try:
                in_redis = int(raw)
            except ValueError as e:
                raise VersionKeyError(
                    f"{self.keys.trainer_version} holds {raw!r}, not a version number"
                ) from e
        return max(newest_published(self.cfg.weights_root), in_redis)

    def _resume_version(self) -> tuple[int, dict[str, Any]]:
        """The version to (re)publish the restored weights as, and the lineage that goes with it."""
        st = self.trainer.state
        published = self._published_version()
        version, lost = st.lineage.restart(st.version, published)
        if lost is not None:
            self.metrics.orphaned_versions.inc(lost[1] - lost[0] + 1)
            log.warning(
                "checkpoint step %d holds version %d but versions up to %d were published: "
                "versions %d..%d orphaned (their groups will be dropped), restored weights are version %d",
                st.step, st.version, published, lost[0], lost[1], version,
            )  # fmt: skip
        return version, st.lineage.state_dict()

    def _cut_log(self, step: int) -> None:
        """Keep the records of checkpointed steps only (a crash may have logged a lost step, or left a
        torn last line that the next record would be appended to)."""
        path = self.run_dir / TRAIN_LOG
        logged = K.read_step_log(path)
        if logged.torn_line is not None:
            log.warning("%s:%d was cut short by a crash: removed", path, logged.torn_line)
        kept = [rec for rec in logged.records if rec[K.STEP] <= step]
        self.history.extend(kept)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(rec) + "\n" for rec in kept))
        os.replace(tmp, path)

    # ------------------------------------------------------------------ the loop
    @property
    def done(self) -> bool:
        return bool(self.cfg.steps) and self.trainer.state.step >= self.cfg.steps

    def run(self) -> None:
        """Train until ``steps`` (or forever, or a stop request)."""
        st = self.trainer.state
        dist = self.trainer.dist
        # No stop check here: rank 0's fetch sees the stop and broadcasts None, so all ranks leave together.
        while not self.done:
            t_wait = time.perf_counter()
            groups, entry_ids = self._next_batch()
            if groups is None:
                break
            self.state = "training"
            step = st.step + 1
            failpoint("after_fetch", step)
            wait_s = time.perf_counter() - t_wait
            try:
                rec = self.trainer.train_step(groups)
            except Exception as err:
                self._step_failed(step, err)  # raises unless the batch can be tried again
                continue
            self._failed_in_row = 0
            rec[K.PERF_WAIT_S] = wait_s
            rec.update(self._prev_timings)
            self._prev_timings = {
                K.PERF_PREV_CHECKPOINT_S: 0.0,
                K.PERF_PREV_PUBLISH_S: 0.0,
                K.PERF_PREV_NOTIFY_S: 0.0,
            }
            rec[K.DATA_DEAD_LETTERED], self._dead_lettered = self._dead_lettered, 0
            rec[K.DATA_FAILED_ATTEMPTS], self._failed_attempts = self._failed_attempts, 0
            if self.cfg.dynamic_sampling:
                n, self._uniform_skipped = self._uniform_skipped, 0
                rec[K.DATA_UNIFORM_SKIPPED] = n
                rec[K.DATA_UNIFORM_SKIPPED_FRAC] = n / (n + len(groups))
            failpoint("after_train", step)
            st.add_consumed(step, [g.group_id for g in groups])
            publishing = step % self.cfg.publish_every == 0
            if publishing:
                st.version += 1
                st.lineage.prune(st.version, self.cfg.staleness_k)
            rec[K.WEIGHTS_VERSION] = st.version
            if dist.is_main:
                self._log_step(step, rec, entry_ids)
            if step % self.cfg.checkpoint_every == 0 or self.done:
                self._checkpoint(step)
            if publishing:
                self._publish(st.version, step)
                if dist.is_main:
                    failpoint("after_publish", step)
            if dist.is_main:
                self._finish_step(step, rec)
            dist.barrier()
            self.state = "waiting"
        # Stopped between checkpoints: checkpoint what was trained, so it is not trained again.
        if dist.broadcast_object(bool(self._unacked) if dist.is_main else None):
            self._checkpoint(st.step)
            if dist.is_main:
                self._write_info()
                self._tidy_stream()
        self.state = "done" if self.done else "stopped"

    def _start_digest(self, resumed: bool) -> str | None:
        """The tensors digest of the policy this run started from (``llds_proto.digest``, short form),
        taken once when the run starts from ``model`` and kept in ``run_dir/start.json`` for resumes:
        every step record carries it, so a study can tell which start each run had from its log."""
        path = self.run_dir / "start.json"
        if path.is_file():
            return str(json.loads(path.read_text()).get("digest") or "") or None
        if resumed or not self.cfg.model or not Path(self.cfg.model).is_dir():
            return None  # a run from before start digests, or a hub name: nothing local to hash
        from llds_proto.digest import short, tensors_digest

        t = time.perf_counter()
        digest = short(tensors_digest(Path(self.cfg.model)))
        path.write_text(json.dumps({"model": self.cfg.model, "digest": digest}) + "\n")
        log.info(
            "start policy %s: tensors digest %s (%.1f s)", self.cfg.model, digest, time.perf_counter() - t
        )
        return digest

    def _log_step(self, step: int, rec: dict[str, Any], entry_ids: list[str]) -> None:
        """Rank 0: the step's record to the log and trackers; its entries await the next checkpoint."""
        rec[K.PERF_LOAD1] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        rec[K.RUN_START_DIGEST] = self.start_digest
        with open(self.run_dir / TRAIN_LOG, "a") as f:
            f.write(json.dumps(rec) + "\n")
        for w in self.writers:
            w.write(step, rec)
        failpoint("after_log", step)
        self._unacked.extend(entry_ids)

    def _finish_step(self, step: int, rec: dict[str, Any]) -> None:
        """Rank 0, after the step's checkpoint and publish: info, stream, history, metrics, log line."""
        self._write_info()
        self._tidy_stream()
        # The step becomes visible over HTTP once its checkpoint and publish (if any) are done; a
        # step after the last checkpoint is trained again after a crash, and its record replaced.
        with self.lock:
            self.history.append(rec)
            self.completed_step = step
        self.metrics.observe_step(rec)
        log.info(
            "step %d reward %.3f loss %.4f llds %.5f alarm %s (%.1f s)",
            step, rec[K.REWARD_MEAN], rec[K.LOSS_TOTAL], rec[K.LOSS_LLDS], self.trainer.monitor.state, rec[K.PERF_STEP_S],
        )  # fmt: skip

    def _checkpoint(self, step: int) -> None:
        """Checkpoint the trainer (every rank takes part), then rank 0 acknowledges every entry it now
        covers."""
        t = time.perf_counter()
        path = self.trainer.save_checkpoint(self.run_dir)
        if not self.trainer.dist.is_main:
            return
        self.metrics.checkpoint_seconds.set(time.perf_counter() - t)
        self._prev_timings[K.PERF_PREV_CHECKPOINT_S] = time.perf_counter() - t
        failpoint("after_checkpoint", step)
        # The info written with the acknowledgement already names the version this step publishes and
        # no trained-but-unacknowledged entries: a rollout never sees the queue shrink while the info
        # still describes the trainer before the step (it would admit a group one version too early).
        self.queue.ack(self._unacked, also_set=(self.keys.trainer_info, self._info(trained_unacked=0)))
        log.info("step %d checkpointed to %s, acked %d entries", step, path, len(self._unacked))
        self._unacked = []
        failpoint("after_ack", step)

    def _info(self, trained_unacked: int) -> str:
        """What the rollouts' admission control reads (``RunKeys.trainer_info``), as JSON."""
        st = self.trainer.state
        return TrainerInfo(
            run_id=self.cfg.run_id,
            version=st.version,
            step=st.step,
            groups_per_step=self.cfg.groups_per_step,
            publish_every=self.cfg.publish_every,
            staleness_k=self.cfg.staleness_k,
            trained_unacked=trained_unacked,
        ).model_dump_json()

    def _write_info(self) -> None:
        self.redis.set(self.keys.trainer_info, self._info(trained_unacked=len(self._unacked)))

    def _tidy_stream(self) -> None:
        """Trim what every consumer group is done with; export the stream and Redis sizes."""
        n = self.queue.trim()
        if n:
            self.metrics.trimmed.inc(n)
            log.info("trimmed %d acknowledged entries from %s", n, self.keys.stream)
        self.metrics.stream_length.set(self.queue.length())
        self.metrics.consumer_lag.set(self.queue.lag())
        self.metrics.redis_memory.set(int(self.redis.info("memory")["used_memory"]))

    def _next_batch(self) -> tuple[list[TrajectoryGroup] | None, list[str]]:
        """Rank 0 reads ``groups_per_step`` usable groups and broadcasts them; None on stop."""
        dist = self.trainer.dist
        payload: list[bytes] | None = None
        entry_ids: list[str] = []
        if dist.is_main:
            groups, entry_ids = self._fetch_usable()
            payload = None if groups is None else [encode_group(g) for g in groups]
        payload = dist.broadcast_object(payload)
        if payload is None:
            return None, []
        return [decode_group(b) for b in payload], entry_ids

    def _fetch_usable(self) -> tuple[list[TrajectoryGroup] | None, list[str]]:
        want = self.cfg.groups_per_step
        groups: list[TrajectoryGroup] = []
        ids: list[str] = []
        self._batch = []
        seen: set[str] = set()
        uniform_run = 0
        while len(groups) < want:
            if self.stop_event.is_set():
                self.queue.release([])
                return None, []
            carried, self._carry = self._carry[: want - len(groups)], self._carry[want - len(groups) :]
            for e in carried or self.queue.fetch(want - len(groups), self.stop_event.is_set):
                reason = self._drop_reason(e, seen)
                if reason is not None:
                    self.metrics.dropped.labels(reason=reason).inc()
                    log.warning(
                        "dropping entry %s (%s): %s",
                        e.entry_id,
                        e.group.group_id if e.group else "-",
                        reason if e.error is None else e.error,
                    )
                    if reason in streams.POISON_REASONS:
                        self._set_aside(
                            e, reason, e.error or POISON_TEXT[reason].format(n=self.cfg.max_entry_failures)
                        )
                        continue
                    self.queue.ack([e.entry_id])
                    if reason == "uniform":
                        assert e.group is not None  # only a decoded group has rewards to compare
                        self._uniform_skipped += 1
                        uniform_run += 1
                        cap = self.cfg.dynamic_sampling_max_skips
                        if cap and uniform_run >= cap:
                            raise NoLearningSignal(
                                f"dynamic sampling skipped {uniform_run} groups in a row whose rewards were "
                                f"all equal (last: all {e.group.trajectories[0].reward}): no learning "
                                "signal left (a collapsed policy?); raise dynamic_sampling_max_skips or "
                                "turn dynamic_sampling off"
                            )
                    continue
                uniform_run = 0
                assert e.group is not None
                seen.add(e.group.group_id)
                groups.append(e.group)
                ids.append(e.entry_id)
                self._batch.append(e)
        return groups, ids

    def _set_aside(self, e: Any, reason: str, error: str) -> None:
        """Rank 0: ``e`` to the run's dead-letter stream (acknowledged here in the same transaction)."""
        dead = self.queue.set_aside(e, reason, error)
        self.metrics.dead_lettered.labels(reason=reason).inc()
        self._dead_lettered += 1
        log.warning(
            "entry %s (%s) set aside as %s in %s (%s): %s",
            e.entry_id, e.group.group_id if e.group else "-", dead, self.keys.dead_letter, reason, error,
        )  # fmt: skip

    def _step_failed(self, step: int, err: Exception) -> None:
        """A training step raised. With one rank and no optimizer update applied yet (the weights and
        the optimizer's state are as before the step), find the entries to blame (each group alone
        through a forward and backward; all of them when none fails alone), count a failure for each,
        set aside those that reached ``max_entry_failures`` and try the step again with the others.
        Otherwise (or after ``max_failed_steps_in_row`` failed attempts) count a failure for every
        entry of the step and raise: the restarted trainer resumes from its checkpoint, and the counts
        in Redis end a crash loop."""
        tr = self.trainer
        self.metrics.failed_steps.inc()
        self._failed_attempts += 1
        self._failed_in_row += 1
        batch, self._batch = self._batch, []
        log.warning(
            "step %d failed (attempt %d in a row): %s: %s", step, self._failed_in_row, type(err).__name__, err
        )
        moved = tr.updates_this_step > 0
        if tr.dist.world_size != 1 or moved or self._failed_in_row >= self.cfg.max_failed_steps_in_row:
            if tr.dist.is_main:
                self.queue.count_failure([e.entry_id for e in batch])
            why = ("the weights moved before it failed" if moved else
                   f"{self._failed_in_row} steps in a row failed" if tr.dist.world_size == 1 else
                   "several ranks")  # fmt: skip
            raise RuntimeError(f"training step {step} failed ({why}): {type(err).__name__}: {err}") from err
        tr.optimizer.zero_grad(set_to_none=True)
        alone = {e.entry_id: tr.check_group(e.group) for e in batch}
        blamed = [e for e in batch if alone[e.entry_id]] or batch
        counts = dict(
            zip(
                (e.entry_id for e in blamed),
                self.queue.count_failure([e.entry_id for e in blamed]),
                strict=True,
            )
        )
        for e in batch:
            n = counts.get(e.entry_id, 0)
            if n >= self.cfg.max_entry_failures:
                why = alone[e.entry_id] or f"its step failed {n} times: {type(err).__name__}: {err}"
                self.metrics.dropped.labels(reason="failed").inc()
                self._set_aside(e, "failed", why)
            else:
                self._carry.append(dataclasses.replace(e, failures=n) if n else e)

    def _limits(self) -> tuple[int, int | None]:
        """Token ids the policy can embed (its input embedding rows) and the longest sequence its
        positions cover (None: not stated): a group outside them would fail inside the step, and being
        re-read first after every restart, stop training for good."""
        if not hasattr(self, "_limits_cache"):
            model = self.trainer.model
            vocab = int(model.get_input_embeddings().num_embeddings)
            longest = getattr(model.config, "max_position_embeddings", None)
            self._limits_cache = (vocab, int(longest) if longest else None)
        return self._limits_cache

    def _drop_reason(self, e: Any, seen: set[str]) -> str | None:
        if e.group is None:
            return "invalid"
        if e.failures >= self.cfg.max_entry_failures:
            return "failed"
        g = e.group
        st = self.trainer.state
        if g.run_id and g.run_id != self.cfg.run_id:
            return "foreign"
        if g.group_id in st.consumed_set or g.group_id in seen:
            return "duplicate"
        if not any(any(t.loss_mask) for t in g.trajectories):
            return "empty"
        vocab, longest = self._limits()
        if any(
            not 0 <= i < vocab for t in g.trajectories for ids in (t.prompt_ids, t.response_ids) for i in ids
        ):
            return "out_of_vocab"
        if longest and any(len(t.prompt_ids) + len(t.response_ids) > longest for t in g.trajectories):
            return "too_long"
        if g.max_version > st.version:
            return "ahead"
        sampled = {v for t in g.trajectories for v, m in zip(t.versions, t.loss_mask, strict=True) if m}
        if st.lineage.any_orphaned(sampled):
            return "orphaned"
        if st.lineage.distance(g.min_version, st.version) > self.cfg.staleness_k:
            return "stale"
        if (
            self.cfg.dynamic_sampling
            and max(t.reward for t in g.trajectories) - min(t.reward for t in g.trajectories) <= 1e-9
        ):
            return "uniform"
        return None

    # ------------------------------------------------------------------ publishing
    def _publish(self, version: int, step: int) -> None:
        """Publish ``version``. Every rank calls this (a sharded policy is gathered from all of them);
        rank 0 writes the folder, sets the version key and notifies the replicas."""
        from llds_trainer.publish import is_published, notify_replicas, publish_folder, version_dir_name

        dist = self.trainer.dist
        t = time.perf_counter()
        # With NCCL the weights travel GPU to GPU. Version 0 is the initial model the replicas load.
        write = self.cfg.weight_sync == "filesystem" and version > 0
        if write:
            write = dist.broadcast_object(
                not is_published(self.cfg.weights_root, version) if dist.is_main else None
            )
        if write:
            state = self.trainer.published_state()
            if dist.is_main:
                path = publish_folder(
                    self.trainer.model,
                    self.tokenizer,
                    self.cfg.weights_root,
                    version,
                    step,
                    self.cfg.keep_versions,
                    self.cfg.publish_shard_mb,
                    state_dict=state,
                    keep_every=self.cfg.keep_versions_every,
                    pinned=self._pinned_versions(),
                )
                log.info("published version %d (step %d) to %s", version, step, path)
        if not dist.is_main:
            return
        self.metrics.publish_seconds.set(time.perf_counter() - t)
        self._prev_timings[K.PERF_PREV_PUBLISH_S] = time.perf_counter() - t
        t_notify = time.perf_counter()
        self.redis.set(self.keys.trainer_version, str(version))
        self.metrics.version.set(version)
        if version == 0:
            return  # the replicas start from the initial model: nothing to send
        urls = list(self.cfg.notify_urls)
        for u in self._live_replicas():
            if u not in urls:
                urls.append(u)
        if self.cfg.weight_sync == "nccl":
            if self._nccl is None:
                from llds_trainer.nccl_sync import NCCLWeightSync

                self._nccl = NCCLWeightSync(
                    self.trainer.model,
                    master_address=self.cfg.nccl_master_address,
                    master_port=self.cfg.nccl_master_port,
                    token=self.admin_token,
                    timeout_s=self.cfg.notify_timeout_s,
                )
            results = self._nccl.deliver(urls, version, step)
            self.metrics.publish_seconds.set(time.perf_counter() - t)
        else:
            notice = WeightUpdateNotice(version=version, path=version_dir_name(version), step=step)
            results = notify_replicas(urls, notice, self.admin_token, self.cfg.notify_timeout_s)
        self._prev_timings[K.PERF_PREV_NOTIFY_S] = time.perf_counter() - t_notify
        for res in results:
            if not res.ok:
                self.metrics.notify_failures.inc()

    def _pinned_versions(self) -> set[int]:
        """Versions a replica pinned (``RunKeys.weight_pins``) less than ``pin_ttl_s`` ago; older
        pins (a replica that died mid-read) are removed."""
        from redis.exceptions import RedisError

        cutoff = time.time() - self.cfg.pin_ttl_s
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.zremrangebyscore(self.keys.weight_pins, "-inf", f"({cutoff}")
            pipe.zrangebyscore(self.keys.weight_pins, cutoff, "+inf")
            _, members = pipe.execute()
        except RedisError as e:
            log.warning("could not read the weight pins (keeping every version this time): %s", e)
            root = Path(self.cfg.weights_root)
            return (
                {int(p.name[1:]) for p in root.glob("v*") if p.name[1:].isdigit()} if root.is_dir() else set()
            )
        out = set()
        for m in members:
            v, _, _ = (m.decode() if isinstance(m, bytes) else str(m)).partition("/")
            if v.isdigit():
                out.add(int(v))
        return out

    def _live_replicas(self) -> list[str]:
        """The registered replicas' URLs, after pruning those whose heartbeat is older than
        ``replica_ttl_s`` (entries with no heartbeat, added by hand, stay) and leaving out those whose
        host is not in ``replica_hosts``."""
        from llds_server.settings import redact_url
        from llds_trainer.publish import host_allowed

        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.registry)
        pipe.zrange(self.keys.heartbeats, 0, -1, withscores=True)
        registry, beats = pipe.execute()
        now = time.time()
        dead = {
            (n.decode() if isinstance(n, bytes) else str(n)): now - t
            for n, t in beats
            if now - t > self.cfg.replica_ttl_s
        }
        urls = []
        for name, url in registry.items():
            name = name.decode() if isinstance(name, bytes) else str(name)
            url = url.decode() if isinstance(url, bytes) else str(url)
            if not host_allowed(url, self.cfg.replica_hosts):
                if url not in self._refused:
                    self._refused.add(url)
                    self.metrics.replicas_refused.inc()
                    log.warning(
                        "refused registered replica %s (%s): its host is not in replica_hosts %s; it "
                        "gets no weights", name, redact_url(url), self.cfg.replica_hosts,
                    )  # fmt: skip
                continue
            if name in dead:
                pipe = self.redis.pipeline(transaction=True)
                pipe.hdel(self.keys.registry, name)
                pipe.zrem(self.keys.heartbeats, name)
                pipe.execute()
                self.metrics.replicas_pruned.inc()
                log.warning(
                    "pruned replica %s (%s): last heartbeat %.0f s ago (replica_ttl_s %.0f)",
                    name, redact_url(url), dead[name], self.cfg.replica_ttl_s,
                )  # fmt: skip
                continue
            urls.append(url)
        return urls

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        t = self.trainer
        with self.lock:
            last = self.history[-1] if self.history else None
        return {
            "state": self.state,
            "step": self.completed_step,
            "target_steps": self.cfg.steps,
            "weights_version": t.state.version if t else 0,
            "groups_consumed": t.state.consumed_total if t else 0,
            "lld_alarm": t.monitor.state if t else "ok",
            "last_step": last,
            "error": self.error,
            "world_size": t.dist.world_size if t else 1,
        }

    def close_writers(self) -> None:
        """Flush and close the optional trackers."""
        for w in self.writers:
            w.close()
        self.writers = []

    def history_since(self, since: int) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.history if r["step"] > since]

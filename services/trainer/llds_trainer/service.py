"""The trainer service loop: queue -> step -> log -> checkpoint -> ack -> publish -> notify.

Ordering is what makes a kill -9 at any point safe (see :mod:`llds_trainer.queue`):

1. fetch groups (they stay pending in Redis); drop stale / duplicate / undecodable ones (acked);
2. train one step; append its record to ``train_log.jsonl``;
3. if the step publishes, bump the version *before* the checkpoint, so the checkpoint names the
   version its weights are published as; checkpoint (atomic rename) every ``checkpoint_every`` steps
   and on every publishing step;
4. acknowledge the groups the checkpoint covers;
5. publish the folder (marker last), set ``llds:trainer:version``, notify the rollout replicas
   (``weight_sync = "nccl"``: no folder; the weights go to the replicas over NCCL, :mod:`llds_trainer.nccl_sync`).

On restart: load the newest checkpoint, cut ``train_log.jsonl`` back to its step, and finish a
publish that the crash interrupted (the checkpoint's weights are exactly that version's).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from llds_proto import streams
from llds_proto.codec import decode_group, encode_group
from llds_proto.messages import TrajectoryGroup, WeightUpdateNotice
from llds_trainer.config import TrainerConfig
from llds_trainer.faults import failpoint
from llds_trainer.metrics import TrainerMetrics

log = logging.getLogger("llds.trainer")

TRAIN_LOG = "train_log.jsonl"
CONFIG_FILE = "trainer_config.toml"


class TrainerService:
    """Owns the trainer, the queue and the outputs of one process; the HTTP app reads its state."""

    def __init__(self, cfg: TrainerConfig, admin_token: str | None = None):
        self.cfg = cfg
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
        self._unacked_groups: list[str] = []
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
            # Ride out a Redis restart (~1 min of retries) instead of failing mid-step: every command
            # the trainer sends is safe to repeat (XACK, SADD, SET; a lost XREADGROUP reply leaves the
            # entries pending, and XAUTOCLAIM hands them back).
            self.redis = redis.Redis.from_url(
                self.cfg.redis_url, retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), retries=30)
            )
            self.queue = StreamQueue(
                self.redis,
                self.cfg.consumer_name,
                claim_idle_ms=self.cfg.claim_idle_ms,
                block_ms=self.cfg.read_block_ms,
            )
            self.queue.ensure_group()
        latest = ckpt.latest_checkpoint(self.cfg.run_dir) if self.cfg.resume else None
        if latest is not None:
            self.trainer.load_checkpoint(latest)
            log.info(
                "resumed from %s (step %d, version %d)",
                latest,
                self.trainer.state.step,
                self.trainer.state.version,
            )
        if dist.is_main:
            self._cut_log(self.trainer.state.step)
            from llds_trainer.tracking import make_writers

            self.writers = make_writers(
                list(self.cfg.trackers),
                self.run_dir,
                wandb_project=self.cfg.wandb_project,
                wandb_mode=self.cfg.wandb_mode,
                config=self.cfg.model_dump(mode="json"),
            )
            self.completed_step = self.trainer.state.step
            self.metrics.step.set(self.trainer.state.step)
            self.metrics.version.set(self.trainer.state.version)
            if self.trainer.state.version > 0:
                self._publish(self.trainer.state.version, self.trainer.state.step)
        dist.barrier()
        self.state = "waiting"

    def _cut_log(self, step: int) -> None:
        """Keep the records of checkpointed steps only (a crash may have logged a lost step)."""
        path = self.run_dir / TRAIN_LOG
        kept: list[str] = []
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    if rec["step"] <= step:
                        kept.append(line)
                        self.history.append(rec)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(k + "\n" for k in kept))
        os.replace(tmp, path)

    # ------------------------------------------------------------------ the loop
    @property
    def done(self) -> bool:
        return bool(self.cfg.steps) and self.trainer.state.step >= self.cfg.steps

    def run(self) -> None:
        """Train until ``steps`` (or forever, or a stop request)."""
        while not self.done and not self.stop_event.is_set():
            groups, entry_ids = self._next_batch()
            if groups is None:
                break
            self.state = "training"
            step = self.trainer.state.step + 1
            failpoint("after_fetch", step)
            rec = self.trainer.train_step(groups)
            failpoint("after_train", step)
            self.trainer.state.add_consumed([g.group_id for g in groups])
            publishing = step % self.cfg.publish_every == 0
            if publishing:
                self.trainer.state.version += 1
            rec["weights/version"] = self.trainer.state.version
            if self.trainer.dist.is_main:
                self._after_step(step, rec, entry_ids, [g.group_id for g in groups], publishing)
            self.trainer.dist.barrier()
            self.state = "waiting"
        self.state = "done" if self.done else "stopped"

    def _after_step(
        self, step: int, rec: dict[str, Any], entry_ids: list[str], group_ids: list[str], publishing: bool
    ) -> None:
        with open(self.run_dir / TRAIN_LOG, "a") as f:
            f.write(json.dumps(rec) + "\n")
        for w in self.writers:
            w.write(step, rec)
        failpoint("after_log", step)
        self._unacked.extend(entry_ids)
        self._unacked_groups.extend(group_ids)
        if publishing or step % self.cfg.checkpoint_every == 0 or (self.cfg.steps and step >= self.cfg.steps):
            t = time.perf_counter()
            path = self.trainer.save_checkpoint(self.run_dir)
            self.metrics.checkpoint_seconds.set(time.perf_counter() - t)
            failpoint("after_checkpoint", step)
            self.queue.ack(self._unacked)
            if self._unacked_groups:
                self.redis.sadd(streams.CONSUMED_KEY, *self._unacked_groups)
            log.info("step %d checkpointed to %s, acked %d entries", step, path, len(self._unacked))
            self._unacked, self._unacked_groups = [], []
            failpoint("after_ack", step)
        if publishing:
            self._publish(self.trainer.state.version, step)
            failpoint("after_publish", step)
        # The step becomes visible over HTTP only once it is checkpointed and published.
        with self.lock:
            self.history.append(rec)
            self.completed_step = step
        self.metrics.observe_step(rec)
        log.info(
            "step %d reward %.3f loss %.4f llds %.5f alarm %s (%.1f s)",
            step, rec["reward/mean"], rec["loss/total"], rec["loss/llds"], self.trainer.monitor.state, rec["perf/step_s"],
        )  # fmt: skip

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
        seen = set()
        while len(groups) < want:
            if self.stop_event.is_set():
                self.queue.release([])
                return None, []
            for e in self.queue.fetch(want - len(groups), self.stop_event.is_set):
                reason = self._drop_reason(e, seen)
                if reason is not None:
                    self.metrics.dropped.labels(reason=reason).inc()
                    log.warning(
                        "dropping entry %s (%s): %s",
                        e.entry_id,
                        e.group.group_id if e.group else "-",
                        reason if e.error is None else e.error,
                    )
                    self.queue.ack([e.entry_id])
                    continue
                assert e.group is not None
                seen.add(e.group.group_id)
                groups.append(e.group)
                ids.append(e.entry_id)
        return groups, ids

    def _drop_reason(self, e: Any, seen: set[str]) -> str | None:
        if e.group is None:
            return "invalid"
        g = e.group
        if g.group_id in self.trainer.state.consumed_set or g.group_id in seen:
            return "duplicate"
        mv = g.min_version
        if mv >= 0 and mv < self.trainer.state.version - self.cfg.staleness_k:
            return "stale"
        if not any(any(t.loss_mask) for t in g.trajectories):
            return "empty"
        return None

    # ------------------------------------------------------------------ publishing
    def _publish(self, version: int, step: int) -> None:
        from llds_trainer.publish import is_published, notify_replicas, publish_folder, version_dir_name

        t = time.perf_counter()
        # With NCCL the weights travel GPU to GPU; the checkpoint already holds this version.
        if self.cfg.weight_sync == "filesystem" and not is_published(self.cfg.weights_root, version):
            path = publish_folder(
                self.trainer.model,
                self.tokenizer,
                self.cfg.weights_root,
                version,
                step,
                self.cfg.keep_versions,
            )
            log.info("published version %d (step %d) to %s", version, step, path)
        self.metrics.publish_seconds.set(time.perf_counter() - t)
        self.redis.set(streams.DEFAULT_KEYS.trainer_version, str(version))
        self.metrics.version.set(version)
        urls = list(self.cfg.notify_urls)
        for u in self.redis.hgetall(streams.DEFAULT_KEYS.registry).values():
            u = u.decode() if isinstance(u, bytes) else str(u)
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
        for res in results:
            if not res.ok:
                self.metrics.notify_failures.inc()

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
            "groups_consumed": len(t.state.consumed) if t else 0,
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
